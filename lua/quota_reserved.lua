-- quota_reserved: the live entries of the reservation index, {tag, held, ...}, entries past
-- their end dropped (on Redis' clock). KEYS[1]: the index.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local held, ends = string.match(all[i + 1], '^([^|]+)|(%d+)|')
  if ends ~= nil and tonumber(ends) > now then
    out[#out + 1] = all[i]
    out[#out + 1] = held
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
