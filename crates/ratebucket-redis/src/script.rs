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
/// the visit (0 a lease, 1 leaving, 2 only giving back), the number of dimensions, then per dimension: rate (permits/s), capacity,
/// wanted, needed (what its first waiter lacks), given back; then the booking horizon (lease
/// periods). Returns per dimension the grant, then the gate's remaining pause (µs), its
/// epoch, whether the state was (re)created, the rate (as a string) and capacity per
/// dimension, a hint (µs) of when a slice of the unmet want will have refilled, when
/// the grant may be spent (µs from now; zero unless booked), and how many processes hold
/// a live record (this one included).
const LEASE: &str = include_str!("lua/lease.lua");

/// Closes the shared gate for a pause, unless it is closed already (the same wave of
/// throttles), empties every dimension (the provider has nothing left), and announces the
/// pause on the channel.
///
/// ARGV: pause (µs), channel, the announcing process's id (its own listener skips it).
/// Returns whether this call closed the gate, the epoch, and
/// the remaining pause (µs).
const PAUSE: &str = include_str!("lua/pause.lua");

/// Lowers a dimension's shared rate and capacity to what one process learned (never
/// raises them). ARGV: dimension (from 1), rate (permits/s), capacity. Returns 1 if
/// something was lowered, 0 if not, -1 if the quota does not exist yet.
const LOWER: &str = include_str!("lua/lower.lua");

/// The scripts' bodies, for a server that has them loaded (a simulated one).
#[cfg(feature = "fleet")]
pub(crate) fn bodies() -> [&'static str; 3] {
    [LEASE, PAUSE, LOWER]
}

/// How far ahead (in lease periods) a first waiter's need may be booked.
pub(crate) const BOOKING_HORIZON: u32 = 32;

/// What a call to the lease script is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Visit {
    /// A lease: grants, bookings, and what is given back.
    Lease = 0,
    /// Leaving the quota: what is given back, and the record removed.
    Leave = 1,
    /// Only giving back: nothing granted or booked, the record's demand kept.
    GiveBack = 2,
}

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
    /// Processes with a live record, this one included.
    pub(crate) live: u64,
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
        visit: Visit,
        asks: &[Ask],
    ) -> redis::RedisResult<Lease> {
        let mut call = self.lease.key(&keys.bucket);
        call.key(&keys.procs)
            .arg(id)
            .arg(ttl_ms)
            .arg(u8::from(seen))
            .arg(visit as u8)
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

    /// A lease ([`LEASE`]), or why there is none.
    pub(crate) async fn lease(
        &mut self,
        ttl_ms: u64,
        seen: bool,
        visit: Visit,
        asks: &[Ask],
    ) -> Result<Lease, Failure> {
        let con = connect(&mut self.con, &self.backend, self.timeout).await?;
        let call = self.scripts.lease(con, &self.keys, &self.id, ttl_ms, seen, visit, asks);
        let answer = tokio::time::timeout(self.timeout, call).await;
        self.answered(answer, "lease")
    }

    /// A pause ([`PAUSE`]), or why there is none.
    pub(crate) async fn pause(&mut self, pause_us: u64) -> Result<Pause, Failure> {
        let con = connect(&mut self.con, &self.backend, self.timeout).await?;
        let call = self.scripts.pause(con, &self.keys, &self.id, pause_us);
        let answer = tokio::time::timeout(self.timeout, call).await;
        self.answered(answer, "pause")
    }

    /// Lowered limits ([`LOWER`]): whether anything was lowered, `None` if the quota does
    /// not exist yet; or why there is no answer.
    pub(crate) async fn lower(
        &mut self,
        dimension: usize,
        rate: f64,
        capacity: u64,
    ) -> Result<Option<bool>, Failure> {
        let con = connect(&mut self.con, &self.backend, self.timeout).await?;
        let call = self.scripts.lower(con, &self.keys, dimension, rate, capacity);
        let answer = tokio::time::timeout(self.timeout, call).await;
        self.answered(answer, "lower")
    }

    fn answered<T>(
        &mut self,
        answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
        what: &str,
    ) -> Result<T, Failure> {
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                tracing::debug!(target: "ratebucket", %error, "redis {what} failed");
                self.con = None;
                Err(Failure::Down)
            }
            Err(_) => {
                tracing::debug!(target: "ratebucket", "redis {what} timed out");
                self.con = None;
                Err(Failure::Slow)
            }
        }
    }
}

/// Why a call to Redis has no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No answer within the timeout: Redis may only be slow (it may even have run the
    /// script, its answer lost).
    Slow,
    /// An error: the connection refused or broken, the server gone or not serving.
    Down,
}

/// The connection, made within `timeout` if there is none.
async fn connect<'a>(
    con: &'a mut Option<Connection>,
    backend: &Backend,
    timeout: Duration,
) -> Result<&'a mut Connection, Failure> {
    if con.is_none() {
        let made = match tokio::time::timeout(timeout, backend.connect()).await {
            Err(_) => return Err(Failure::Slow),
            Ok(Err(_)) => return Err(Failure::Down),
            Ok(Ok(con)) => con,
        };
        *con = Some(made);
    }
    con.as_mut().ok_or(Failure::Down)
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
    if reply.len() != 3 * n + 6 {
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
        live: int(&reply[3 * n + 5])?,
    })
}
