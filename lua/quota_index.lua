-- quota_index: the reservation index every replica's RLS path reads back (one hash, its own hash
-- tag): per descriptor tag, what the live RLQS grants on it hold. Written after each report's
-- grants; a write older than the one stored (two replicas' reports crossing) is dropped. Each
-- entry's clock is that of the node holding its grants (on Cluster, always the same node).
-- KEYS[1]: the index. ARGV: the most entries kept, then per descriptor: tag, requests per second
-- held, when the longest grant ends (us), when the grants were computed (us).
-- Value: "held|ends_us|written_us". Reply: how many descriptors found the index full.
local most = tonumber(ARGV[1])
local full = 0
local longest = 0
for i = 2, #ARGV, 4 do
  local tag, held, ends, now = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local stored = redis.call('HGET', KEYS[1], tag)
  local written = nil
  if stored then written = tonumber(string.match(stored, '|(%d+)$')) end
  if written == nil or written <= now then
    if not stored and redis.call('HLEN', KEYS[1]) >= most then
      full = full + 1
    else
      redis.call('HSET', KEYS[1], tag,
        held .. '|' .. string.format('%d', ends) .. '|' .. string.format('%d', now))
      if ends > longest then longest = ends end
    end
  end
end
-- The index lives as long as its longest entry (entries past their end are dropped on reading).
if longest > 0 then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ttl = redis.call('PTTL', KEYS[1])
  local until_ms = math.floor(longest / 1000) + 1
  if ttl < 0 or now_ms + ttl < until_ms then
    redis.call('PEXPIREAT', KEYS[1], until_ms)
  end
end
return full
