-- check: every descriptor of one call, in one script call (one round trip). Appended to the three
-- algorithm files, which define the functions it dispatches to.
--
-- KEYS: one counter key per check; all must hash to one slot in Cluster mode (each call from
--       Portcullis in Cluster mode carries a single key).
-- ARGV[1]: a clock reading in microseconds for tests, or 0: read Redis TIME (production always
--       sends 0; replicas' host clocks drift, Redis' clock is the one all of them share).
-- ARGV[2]: the call's mode: 0 each check charged alone, 1 all or nothing (if any charge would be
--       refused, no charge is made; refunds apply), 2 probe (nothing is written).
-- ARGV[3 + 6*(i-1) ...]: for KEYS[i], the operation (1 sliding, 2 bucket, 3 fixed; 11, 12, 13 the
--       same algorithms' refunds) and five numbers whose meaning is the operation's.
-- Returns one array per key, as each algorithm function documents.
local now = tonumber(ARGV[1])
if now == 0 then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local mode = tonumber(ARGV[2])

local function run(i, commit)
  local base = 3 + 6 * (i - 1)
  local op = tonumber(ARGV[base])
  local a, b, c, d, e = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]),
    tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5])
  if op == 1 then
    return sliding_window(KEYS[i], now, a, b, c, commit)
  elseif op == 2 then
    return token_bucket(KEYS[i], now, a, b, c, d, e, commit)
  elseif op == 3 then
    return fixed_window(KEYS[i], now, a, b, c, commit)
  elseif op == 11 then
    return sliding_refund(KEYS[i], now, a, c, commit)
  elseif op == 12 then
    return bucket_refund(KEYS[i], now, a, b, c, commit)
  elseif op == 13 then
    return fixed_refund(KEYS[i], now, a, c, commit)
  end
  return redis.error_reply('portcullis: unknown operation ' .. tostring(ARGV[base]))
end

local commit_charges = mode == 0
if mode == 1 then
  -- Look first: a charge happens only if every charge of the call would pass.
  commit_charges = true
  for i = 1, #KEYS do
    if tonumber(ARGV[3 + 6 * (i - 1)]) < 10 then
      local looked = run(i, false)
      if looked.err then return looked end
      if looked[1] == 0 then commit_charges = false end
    end
  end
end
local results = {}
for i = 1, #KEYS do
  local refund = tonumber(ARGV[3 + 6 * (i - 1)]) > 10
  local result = run(i, mode ~= 2 and (refund or commit_charges))
  if result.err then return result end
  results[i] = result
end
return results
