-- The lease (see `LEASE` in script.rs): refills the shared bucket on Redis's clock, records the
-- process's demand, and grants or books it a fair slice of every dimension at once.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local st, procs = KEYS[1], KEYS[2]
local pid, ttl = ARGV[1], tonumber(ARGV[2]) * 1000
local seen, n = ARGV[3] == '1', tonumber(ARGV[5])
-- The visit: '0' a lease, '1' leaving, '2' only giving back (nothing granted or booked,
-- the record's demand kept).
local leaving, giving = ARGV[4] == '1', ARGV[4] == '2'
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
local live = 1
local all = redis.call('HGETALL', procs)
for j = 1, #all, 2 do
  local id, rec = all[j], all[j + 1]
  local fields = {}
  for f in string.gmatch(rec, '%S+') do fields[#fields + 1] = tonumber(f) end
  if (fields[1] or 0) < now then
    redis.call('HDEL', procs, id)
  elseif id == pid then
    mine = fields
  else
    live = live + 1
    if now <= (fields[3 + 2 * n] or ((fields[2] or 0) + period * 1250000)) then
      -- A process that still wants more comes back when it was told to (within a lease
      -- period, or when its share covers its first waiter); one that has not is no
      -- longer counted, so its share goes to the others.
      others[#others + 1] = fields
    end
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
local short_share = false
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
    -- What it gives back (unused, or its time to be spent over) was taken from its share:
    -- the share has it back.
    share = math.min(share_cap,
      mine[2 + 2 * i] + rate / wanting * math.max(0, now - since) / 1000000 + back)
  end
  if need > 0 and math.min(ready, share) < need then
    covered = false
    if rate > 0 then
      -- When this process's share will have refilled the need (at rate / wanting), and
      -- the bucket will have, the bookings ahead served first (at the whole rate).
      local from_share = (need - share) * wanting / rate * 1000000
      local from_bucket = ahead + math.max(0, need - level) / rate * 1000000
      hint = math.max(hint, math.ceil(math.max(from_share, from_bucket)))
      -- When the need can be booked: after the last booking's start, once the bucket
      -- has refilled it from there. Only a need the share covers now is booked: one
      -- dated later by the share would hold every later booking back behind it while
      -- the bucket's refill meanwhile overflowed its capacity; the process comes back
      -- when its share covers it (the hint).
      if share < need then short_share = true end
      start = math.max(start, math.ceil(from_bucket))
    else
      start = math.huge
    end
  end
  levels[i], at[i], shares[i], wants[i], needs[i], wantings[i] = level, ti, share, want, need, wanting
  share_caps[i], owed[i] = share_cap, ready
  rates[i], caps[i] = rate, cap
end
local lease_us = period * 1000000
local open = now >= gate and not leaving and not giving
local book = not covered and not short_share and open and start <= horizon * lease_us
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
out[#out + 1] = live
return out
