-- check: every descriptor of one call, in one script call (one round trip). Appended to the three
-- algorithm files, which define the functions it dispatches to.
--
-- KEYS: one counter key per check; all must hash to one slot in Cluster mode (each call from
--       Portcullis in Cluster mode carries a single key).
-- ARGV[1]: a clock reading in microseconds for tests, or 0: read Redis TIME (production always
--       sends 0; replicas' host clocks drift, Redis' clock is the one all of them share).
-- ARGV[2 + 6*(i-1) ...]: for KEYS[i], the algorithm (1 sliding, 2 bucket, 3 fixed) and five
--       numbers whose meaning is the algorithm's (see each function).
-- Returns one array per key, as each algorithm function documents.
local now = tonumber(ARGV[1])
if now == 0 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local results = {}
for i = 1, #KEYS do
  local base = 2 + 6 * (i - 1)
  local algorithm = tonumber(ARGV[base])
  local a, b, c, d, e = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]),
    tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5])
  if algorithm == 1 then
    results[i] = sliding_window(KEYS[i], now, a, b, c)
  elseif algorithm == 2 then
    results[i] = token_bucket(KEYS[i], now, a, b, c, d, e)
  elseif algorithm == 3 then
    results[i] = fixed_window(KEYS[i], now, a, b, c)
  else
    return redis.error_reply('portcullis: unknown algorithm ' .. tostring(ARGV[base]))
  end
end
return results
