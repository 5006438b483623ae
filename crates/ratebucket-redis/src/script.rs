//! The Lua scripts that keep the shared bucket in Redis, and their typed calls.
//!
//! Every script runs atomically on the server and reads the server's clock (`TIME`), so
//! processes on machines whose clocks disagree still share one bucket. State lives in
//! three keys sharing one hash tag (so a cluster keeps them on one node):
//!
//! - `ratebucket:{name}:bucket`: per dimension `i` the level `l<i>` at the instant `t<i>`
//!   (µs: the last lease, or the start of the last grant booked ahead), the refill rate
//!   `r<i>` (permits per second) and capacity `c<i>`, the last lease `t` (µs), the gate's
//!   end `gate` (µs) and its epoch `epoch`;
//! - `ratebucket:{name}:procs`: per process, its record's expiry, its unmet demand and its
//!   fair share of every dimension;
//! - `ratebucket:{name}:gate`: the pub/sub channel a closing gate is announced on.

use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::backend::{Backend, Connection};

/// The keys of one shared quota.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    pub(crate) bucket: String,
    pub(crate) procs: String,
    pub(crate) channel: String,
}

impl Keys {
    pub(crate) fn new(name: &str) -> Keys {
        Keys {
            bucket: format!("ratebucket:{{{name}}}:bucket"),
            procs: format!("ratebucket:{{{name}}}:procs"),
            channel: format!("ratebucket:{{{name}}}:gate"),
        }
    }
}

/// Refills the bucket on the server's clock, records this process's demand, and hands it
/// a fair slice of every dimension at once: at most what the bucket has, and at most this
/// process's share, which refills at the rate divided among the processes that want more.
///
/// A first waiter that neither the share nor the bucket covers yet is **booked** when they
/// will, if that is within the horizon: its need is granted at once, taken from both (the
/// bucket's level may go below zero: what is owed to bookings), and the process spends it
/// only after the booking's start. One round trip then serves the waiter, however long it
/// waits; later bookings queue behind, since the level counts the earlier ones.
///
/// ARGV: process id, lease ttl (ms), 1 if the process has seen the state before, 1 if it is
/// leaving, the number of dimensions, then per dimension: rate (permits/s), capacity,
/// wanted, needed (what its first waiter lacks), given back; then the booking horizon (lease
/// periods). Returns per dimension the grant, then the gate's remaining pause (µs), its
/// epoch, whether the state was (re)created, the rate (as a string) and capacity per
/// dimension, a hint (µs) of when a slice of the unmet want will have refilled, and when
/// the grant may be spent (µs from now; zero unless booked).
const LEASE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local st, procs = KEYS[1], KEYS[2]
local pid, ttl = ARGV[1], tonumber(ARGV[2]) * 1000
local seen, leaving, n = ARGV[3] == '1', ARGV[4] == '1', tonumber(ARGV[5])
local horizon = tonumber(ARGV[6 + 5 * n])
local period = ttl / 3000000
local created = 0
if redis.call('HEXISTS', st, 'r1') == 0 then
  -- A quota not known yet starts full; one a process saw before was lost (Redis restarted
  -- without its data) and starts empty, since its burst may already have been spent.
  created = 1
  for i = 1, n do
    local b = 5 + (i - 1) * 5
    local cap = tonumber(ARGV[b + 2])
    redis.call('HSET', st, 'r' .. i, ARGV[b + 1], 'c' .. i, cap, 'l' .. i, seen and 0 or cap,
      't' .. i, now)
  end
  redis.call('HSET', st, 't', now)
  if redis.call('HEXISTS', st, 'epoch') == 0 then
    redis.call('HSET', st, 'epoch', 0, 'gate', 0)
  end
end
local gate = tonumber(redis.call('HGET', st, 'gate')) or 0
local epoch = tonumber(redis.call('HGET', st, 'epoch')) or 0
-- Every other live process's unmet demand; expired records are dropped. A record is
-- "<expiry> <time of its shares> (<unmet> <share>) per dimension <counted until>".
local others = {}
local mine = nil
local all = redis.call('HGETALL', procs)
for j = 1, #all, 2 do
  local id, rec = all[j], all[j + 1]
  local fields = {}
  for f in string.gmatch(rec, '%S+') do fields[#fields + 1] = tonumber(f) end
  if (fields[1] or 0) < now then
    redis.call('HDEL', procs, id)
  elseif id == pid then
    mine = fields
  elseif now <= (fields[3 + 2 * n] or ((fields[2] or 0) + period * 1250000)) then
    -- A process that still wants more comes back when it was told to (within a lease
    -- period, or when its share covers its first waiter); one that has not is no longer
    -- counted, so its share goes to the others.
    others[#others + 1] = fields
  end
end
-- Each dimension is a token bucket kept as its level `l` at its time `t` (µs): `t` is now
-- or, while grants are booked ahead, the start of the last booking, the level being what
-- is left at that instant. Every grant takes from the bucket at the instant it may be
-- spent, and no grant is ever dated before an earlier one's start: so the grants, dated
-- when they may be spent, are what one token bucket of this rate and capacity would
-- admit, and any window W holds at most `capacity + rate * W` of them.
--
-- Fairness: each process wanting more than it has is owed an equal part of the refill.
-- Its share refills at rate / (processes wanting) up to the larger of the capacity and
-- a lease period's refill (the ttl is three periods), divided the same way, and never
-- below what its first waiter needs (else, with more processes than units, every share
-- would stay below one unit and nobody would ever be granted). A grant takes from both
-- its share and the bucket, so the bucket bounds what all take together and the shares
-- split it evenly among those who want it. A process whose first waiter's need is not
-- covered in every dimension is granted nothing this time (a part would sit idle with it
-- while the waiter still waits); its share goes on refilling.
local since = mine and mine[2] or now
local grants, rates, caps, unmet, shares = {}, {}, {}, {}, {}
local levels, at, owed, wants, needs, wantings, share_caps = {}, {}, {}, {}, {}, {}, {}
local covered = true
local hint = 0
-- A first waiter the share and the bucket do not cover yet is booked when they will, if
-- that is within the horizon: its need is granted now, to be spent only after `start` µs.
local start = 0
for i = 1, n do
  local b = 5 + (i - 1) * 5
  local rate = tonumber(redis.call('HGET', st, 'r' .. i))
  local cap = tonumber(redis.call('HGET', st, 'c' .. i))
  local level = tonumber(redis.call('HGET', st, 'l' .. i))
  local ti = tonumber(redis.call('HGET', st, 't' .. i))
  if ti == nil then
    -- A quota kept by an earlier version: one time for all, and a level below zero for
    -- what was booked ahead.
    ti = tonumber(redis.call('HGET', st, 't')) or now
    if level < 0 and rate > 0 then
      ti = math.max(ti, now) + math.ceil(-level / rate * 1000000)
      level = 0
    end
  end
  local want, need, back = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  if ti <= now then
    level = math.min(cap, level + rate * (now - ti) / 1000000 + back)
    ti = now
  else
    level = math.min(cap, level + back)
  end
  -- What the bucket holds for a grant now (nothing while bookings are ahead), and what it
  -- owes them (µs of refill until the last booking's start).
  local ahead = ti - now
  local ready = ahead == 0 and level or 0
  local wanting = 1
  for _, rec in ipairs(others) do
    if (rec[1 + 2 * i] or 0) > 0 then wanting = wanting + 1 end
  end
  -- Room for a lease period's refill, so a share is not cut between two leases.
  local share_cap = math.max(math.max(cap, rate * period) / wanting, need)
  local share = share_cap
  if mine and mine[2 + 2 * i] then
    share = math.min(share_cap, mine[2 + 2 * i] + rate / wanting * math.max(0, now - since) / 1000000)
  end
  if need > 0 and math.min(ready, share) < need then
    covered = false
    if rate > 0 then
      -- When this process's share will have refilled the need, and its part of the
      -- bucket's refill (a wanting process's turn comes at rate / wanting) will have.
      local short = math.max(need - share, need - level + rate * ahead / 1000000) * wanting
      hint = math.max(hint, math.ceil(short / rate * 1000000))
      -- When the need can be booked: after the last booking's start, once the bucket
      -- has refilled it from there, and once the share has.
      local from_share = (need - share) * wanting / rate * 1000000
      local from_bucket = ahead + math.max(0, need - level) / rate * 1000000
      start = math.max(start, math.ceil(math.max(from_share, from_bucket)))
    else
      start = math.huge
    end
  end
  levels[i], at[i], shares[i], wants[i], needs[i], wantings[i] = level, ti, share, want, need, wanting
  share_caps[i], owed[i] = share_cap, ready
  rates[i], caps[i] = rate, cap
end
local lease_us = period * 1000000
local open = now >= gate and not leaving
local book = not covered and open and start <= horizon * lease_us
if not book then start = 0 end
for i = 1, n do
  local level, share, want, rate = levels[i], shares[i], wants[i], rates[i]
  local grant = 0
  if covered and open and want > 0 then
    grant = math.floor(math.max(0, math.min(want, owed[i], share)))
  elseif book then
    grant = needs[i]
  end
  if book and grant > 0 then
    -- Taken at the booking's start: the bucket refills to then (never above its
    -- capacity) and the grant leaves what is left at that instant.
    local when = now + start
    level = math.min(caps[i], level + rate * (when - at[i]) / 1000000) - grant
    at[i] = when
  else
    level = level - grant
  end
  redis.call('HSET', st, 'l' .. i, tostring(level), 't' .. i, string.format('%d', at[i]))
  -- The level as if the bookings ahead were taken now (below zero while they are owed):
  -- what the hints below reckon with.
  levels[i] = level - rate * (at[i] - now) / 1000000
  grants[i], rates[i] = grant, tostring(rate)
  unmet[i] = want - grant
  shares[i] = share - grant
  if (covered or book) and unmet[i] > 0 and rate > 0 then
    -- When this process's share will have refilled what it still wants, or as much of it
    -- as the share holds (waiting longer would gain nothing), and never less than a unit
    -- (a grant is whole units); and the bucket too (below zero while bookings are owed).
    local target = math.min(unmet[i], math.max(share_caps[i], 1))
    local short = math.max((target - shares[i]) * wantings[i], target - levels[i], 0)
    hint = math.max(hint, math.ceil(short / rate * 1000000))
  end
end
-- A process that wants nothing more is told when the bucket will hold a unit again, if
-- it does not now: it asks to spend ahead no sooner.
local wants_more = false
for i = 1, n do
  if unmet[i] > 0 then wants_more = true end
end
if not wants_more then
  for i = 1, n do
    local rate = tonumber(rates[i])
    if levels[i] < 1 and rate > 0 then
      hint = math.max(hint, math.ceil((1 - levels[i]) / rate * 1000000))
    end
  end
end
redis.call('HSET', st, 't', now)
-- The process comes back when its share will have refilled (the need of its first
-- waiter, or what it wants up to what the share holds), at most eight lease periods
-- away, and stays counted as wanting until then, with no round trip in between.
hint = math.min(hint, 8 * lease_us)
if leaving then
  redis.call('HDEL', procs, pid)
else
  local counted = now + math.max(1.25 * lease_us, hint + 0.25 * lease_us)
  local rec = {math.max(now + ttl, counted), now}
  for i = 1, n do
    rec[#rec + 1] = unmet[i]
    rec[#rec + 1] = string.format('%.3f', shares[i])
  end
  rec[#rec + 1] = string.format('%d', counted)
  redis.call('HSET', procs, pid, table.concat(rec, ' '))
end
redis.call('PEXPIRE', st, 3600000)
redis.call('PEXPIRE', procs, 3600000)
local out = {}
for i = 1, n do out[#out + 1] = grants[i] end
out[#out + 1] = math.max(0, gate - now)
out[#out + 1] = epoch
out[#out + 1] = created
for i = 1, n do out[#out + 1] = rates[i] end
for i = 1, n do out[#out + 1] = caps[i] end
out[#out + 1] = hint
out[#out + 1] = start
return out
"#;

/// Closes the shared gate for a pause, unless it is closed already (the same wave of
/// throttles), empties every dimension (the provider has nothing left), and announces the
/// pause on the channel.
///
/// ARGV: pause (µs), channel, the announcing process's id (its own listener skips it).
/// Returns whether this call closed the gate, the epoch, and
/// the remaining pause (µs).
const PAUSE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local st = KEYS[1]
local pause = tonumber(ARGV[1])
local gate = tonumber(redis.call('HGET', st, 'gate')) or 0
local epoch = tonumber(redis.call('HGET', st, 'epoch')) or 0
if now < gate then
  return {0, epoch, gate - now}
end
epoch = epoch + 1
redis.call('HSET', st, 'gate', now + pause, 'epoch', epoch)
local i = 1
while redis.call('HEXISTS', st, 'l' .. i) == 1 do
  -- Bookings ahead stay owed (the bucket's time stays at the last one's start); what is
  -- left, then or now, is gone. An earlier version's level below zero stays as it is.
  local level = tonumber(redis.call('HGET', st, 'l' .. i))
  local ti = tonumber(redis.call('HGET', st, 't' .. i))
  if ti ~= nil and ti < now then
    redis.call('HSET', st, 't' .. i, now)
  end
  redis.call('HSET', st, 'l' .. i, tostring(math.min(level, 0)))
  i = i + 1
end
redis.call('PUBLISH', ARGV[2], epoch .. ' ' .. pause .. ' ' .. ARGV[3])
return {1, epoch, pause}
"#;

/// Lowers a dimension's shared rate and capacity to what one process learned (never
/// raises them). ARGV: dimension (from 1), rate (permits/s), capacity. Returns 1 if
/// something was lowered, 0 if not, -1 if the quota does not exist yet.
const LOWER: &str = r#"
local st = KEYS[1]
local i, rate, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local old_rate = tonumber(redis.call('HGET', st, 'r' .. i))
local old_cap = tonumber(redis.call('HGET', st, 'c' .. i))
if old_rate == nil then return -1 end
local changed = 0
if rate < old_rate then
  redis.call('HSET', st, 'r' .. i, tostring(rate))
  changed = 1
end
if cap < old_cap then
  redis.call('HSET', st, 'c' .. i, cap)
  local level = tonumber(redis.call('HGET', st, 'l' .. i))
  if level > cap then redis.call('HSET', st, 'l' .. i, cap) end
  changed = 1
end
return changed
"#;

/// How far ahead (in lease periods) a first waiter's need may be booked.
pub(crate) const BOOKING_HORIZON: u32 = 32;

/// One dimension of a lease request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask {
    pub(crate) rate: f64,
    pub(crate) capacity: u64,
    pub(crate) want: u64,
    /// What the first waiter lacks: a grant below it is not made.
    pub(crate) need: u64,
    pub(crate) give_back: u64,
}

/// What the server answered to a lease request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Lease {
    pub(crate) granted: Vec<u64>,
    pub(crate) paused_for_us: u64,
    pub(crate) epoch: u64,
    pub(crate) created: bool,
    pub(crate) rates: Vec<f64>,
    pub(crate) capacities: Vec<u64>,
    pub(crate) hint_us: u64,
    /// When the grant may be spent (µs from now): zero, or a booking's start.
    pub(crate) start_us: u64,
}

/// What the server answered to a pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pause {
    pub(crate) closed: bool,
    pub(crate) epoch: u64,
    pub(crate) remaining_us: u64,
}

/// The three scripts, loaded once (sent by hash, and by body when the server lost them).
struct Scripts {
    lease: Script,
    pause: Script,
    lower: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts { lease: Script::new(LEASE), pause: Script::new(PAUSE), lower: Script::new(LOWER) }
    }

    #[allow(clippy::too_many_arguments)]
    async fn lease(
        &self,
        con: &mut impl ConnectionLike,
        keys: &Keys,
        id: &str,
        ttl_ms: u64,
        seen: bool,
        leaving: bool,
        asks: &[Ask],
    ) -> redis::RedisResult<Lease> {
        let mut call = self.lease.key(&keys.bucket);
        call.key(&keys.procs)
            .arg(id)
            .arg(ttl_ms)
            .arg(u8::from(seen))
            .arg(u8::from(leaving))
            .arg(asks.len());
        for ask in asks {
            call.arg(ask.rate.to_string())
                .arg(ask.capacity)
                .arg(ask.want)
                .arg(ask.need)
                .arg(ask.give_back);
        }
        call.arg(BOOKING_HORIZON);
        let reply: Vec<redis::Value> = call.invoke_async(con).await?;
        parse_lease(&reply, asks.len()).ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "lease script reply",
                format!("{reply:?}"),
            ))
        })
    }

    async fn pause(
        &self,
        con: &mut impl ConnectionLike,
        keys: &Keys,
        id: &str,
        pause_us: u64,
    ) -> redis::RedisResult<Pause> {
        let (closed, epoch, remaining_us): (u8, u64, u64) = self
            .pause
            .key(&keys.bucket)
            .arg(pause_us)
            .arg(&keys.channel)
            .arg(id)
            .invoke_async(con)
            .await?;
        Ok(Pause { closed: closed == 1, epoch, remaining_us })
    }

    async fn lower(
        &self,
        con: &mut impl ConnectionLike,
        keys: &Keys,
        dimension: usize,
        rate: f64,
        capacity: u64,
    ) -> redis::RedisResult<Option<bool>> {
        let changed: i8 = self
            .lower
            .key(&keys.bucket)
            .arg(dimension + 1)
            .arg(rate.to_string())
            .arg(capacity)
            .invoke_async(con)
            .await?;
        Ok((changed >= 0).then_some(changed == 1))
    }
}

/// One process's way to the quota: its connection (made on first use, dropped when a
/// call fails, so the next makes a new one), the scripts, the keys and its id; every
/// call bounded by the timeout.
pub(crate) struct Remote {
    backend: Backend,
    con: Option<Connection>,
    scripts: Scripts,
    keys: Keys,
    id: String,
    timeout: Duration,
}

impl Remote {
    pub(crate) fn new(backend: Backend, keys: Keys, id: String, timeout: Duration) -> Remote {
        Remote { backend, con: None, scripts: Scripts::new(), keys, id, timeout }
    }

    /// A lease ([`LEASE`]); `None` if Redis did not answer in time.
    pub(crate) async fn lease(
        &mut self,
        ttl_ms: u64,
        seen: bool,
        leaving: bool,
        asks: &[Ask],
    ) -> Option<Lease> {
        let con = connect(&mut self.con, &self.backend, self.timeout).await?;
        let call = self.scripts.lease(con, &self.keys, &self.id, ttl_ms, seen, leaving, asks);
        let answer = tokio::time::timeout(self.timeout, call).await;
        self.answered(answer, "lease")
    }

    /// A pause ([`PAUSE`]); `None` if Redis did not answer in time.
    pub(crate) async fn pause(&mut self, pause_us: u64) -> Option<Pause> {
        let con = connect(&mut self.con, &self.backend, self.timeout).await?;
        let call = self.scripts.pause(con, &self.keys, &self.id, pause_us);
        let answer = tokio::time::timeout(self.timeout, call).await;
        self.answered(answer, "pause")
    }

    /// Lowered limits ([`LOWER`]): whether anything was lowered, `None` inside if the quota
    /// does not exist yet; `None` if Redis did not answer in time.
    pub(crate) async fn lower(
        &mut self,
        dimension: usize,
        rate: f64,
        capacity: u64,
    ) -> Option<Option<bool>> {
        let con = connect(&mut self.con, &self.backend, self.timeout).await?;
        let call = self.scripts.lower(con, &self.keys, dimension, rate, capacity);
        let answer = tokio::time::timeout(self.timeout, call).await;
        self.answered(answer, "lower")
    }

    fn answered<T>(
        &mut self,
        answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
        what: &str,
    ) -> Option<T> {
        match answer {
            Ok(Ok(value)) => Some(value),
            Ok(Err(error)) => {
                tracing::debug!(target: "ratebucket", %error, "redis {what} failed");
                self.con = None;
                None
            }
            Err(_) => {
                tracing::debug!(target: "ratebucket", "redis {what} timed out");
                self.con = None;
                None
            }
        }
    }
}

/// The connection, made within `timeout` if there is none.
async fn connect<'a>(
    con: &'a mut Option<Connection>,
    backend: &Backend,
    timeout: Duration,
) -> Option<&'a mut Connection> {
    if con.is_none() {
        let make = backend.connect();
        *con = Some(tokio::time::timeout(timeout, make).await.ok()?.ok()?);
    }
    con.as_mut()
}

fn int(value: &redis::Value) -> Option<u64> {
    match value {
        redis::Value::Int(i) => u64::try_from(*i).ok(),
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

fn float(value: &redis::Value) -> Option<f64> {
    match value {
        redis::Value::Int(i) => Some(*i as f64),
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

fn parse_lease(reply: &[redis::Value], n: usize) -> Option<Lease> {
    if reply.len() != 3 * n + 5 {
        return None;
    }
    let granted = reply[..n].iter().map(int).collect::<Option<Vec<_>>>()?;
    let rates = reply[n + 3..2 * n + 3].iter().map(float).collect::<Option<Vec<_>>>()?;
    let capacities = reply[2 * n + 3..3 * n + 3].iter().map(int).collect::<Option<Vec<_>>>()?;
    Some(Lease {
        granted,
        paused_for_us: int(&reply[n])?,
        epoch: int(&reply[n + 1])?,
        created: int(&reply[n + 2])? == 1,
        rates,
        capacities,
        hint_us: int(&reply[3 * n + 3])?,
        start_us: int(&reply[3 * n + 4])?,
    })
}
