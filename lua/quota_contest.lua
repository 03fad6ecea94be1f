-- quota_contest: marks descriptors contested (a gateway was short of its fair share on them:
-- others hold it), for every replica's push round (quota_contested.lua). One sorted set, its own
-- hash tag: member the descriptor tag, score when it ends (ms). Bounded: past the most kept, the
-- entries ending first are dropped. KEYS[1]: the feed. ARGV: the most kept, when they end (ms), tags.
local most, ends = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do
  -- Never moves an end earlier (ZADD's GT needs Redis 6.2).
  local old = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if not old or tonumber(old) < ends then
    redis.call('ZADD', KEYS[1], ends, ARGV[i])
  end
end
local over = redis.call('ZCARD', KEYS[1]) - most
if over > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
-- Every entry ends within seconds; the feed outlives the last written by a margin.
redis.call('PEXPIRE', KEYS[1], 10000)
return 0
