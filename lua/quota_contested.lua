-- quota_contested: the descriptors contested now (quota_contest.lua), ended ones dropped, on
-- Redis' clock. KEYS[1]: the feed. ARGV[1]: the most returned.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
return redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
