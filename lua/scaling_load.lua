-- scaling_load: every temporary scaling factor with Redis' clock: {now_ms, {field, "factor|expiry", ...}}.
-- KEYS[1]: the factors' hash.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('HGETALL', KEYS[1])}
