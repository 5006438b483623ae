-- Lowered limits (see `LOWER` in script.rs): never raises a shared rate or capacity.
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
