-- The pause (see `PAUSE` in script.rs): closes the shared gate once per wave and announces it.
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
