-- scaling_save: sets (or, with a TTL of 0, removes) one factor, expiring on Redis' clock; drops the
-- expired ones and keeps the hash as long as its longest entry (every key has a TTL).
-- KEYS[1]: the factors' hash. ARGV: field, factor, ttl in ms (0 removes), the most entries kept.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function expiry(value)
  return tonumber(string.match(value, '|(%d+)$'))
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local expires = expiry(all[i + 1])
  if expires == nil or expires <= now then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
      and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
    return redis.error_reply('TOOMANY scaling factors are set already')
  end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. (now + ttl))
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local longest = 0
all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local expires = expiry(all[i + 1])
  if expires ~= nil and expires > longest then
    longest = expires
  end
end
if longest > 0 then
  redis.call('PEXPIREAT', KEYS[1], longest)
end
return now
