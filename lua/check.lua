-- check: the checks of one or more calls, in one script call (one round trip): the calls of a
-- batch, applied in order, each decided on its own, each key's state read once and written once.
-- Appended to the three algorithm files, which define the functions it dispatches to.
--
-- KEYS: every call's counter keys, call after call; in Cluster mode all of one slot.
-- ARGV[1]: the number of calls.
-- ARGV[2]: 0, or the number of keys carried in ARGV instead (a Cluster batch over several slots
--       of one node: KEYS then holds only the first key, which routes the call; Redis refuses
--       declared keys of several slots). Those keys follow in ARGV[3..]. Each is first checked to
--       be this node's and not half migrated away, before anything is read or written: if one
--       is not, the script replies TRYAGAIN having done nothing, and Portcullis sends the calls
--       one by one (see cluster_batch.rs).
-- Then, per call:
--   a clock reading in microseconds for tests, or 0: Redis TIME (production always sends 0;
--       replicas' host clocks drift, Redis' clock is the one all of them share; read once per
--       script call);
--   the call's mode: 0 each check charged alone, 1 all or nothing (if any charge would be
--       refused, no charge is made; refunds apply), 2 probe (nothing is written);
--   its number of keys;
--   for each of its keys, the operation (1 sliding, 2 bucket, 3 fixed; 11, 12, 13 the same
--       algorithms' refunds; 21, 22, 23 their post-paid charges: hits already consumed, recorded
--       even when they do not fit, the reply still saying whether they did) and five numbers
--       whose meaning is the operation's.
-- Returns one string: the calls separated by ';', each call's keys by ',', each key's numbers by
-- ' ' (common.lua's `reply`), as each algorithm function documents. An error reply (a table) ends
-- the script call after what was admitted is written.
local redis_now = nil
local function clock(arg)
  local now = tonumber(arg)
  if now ~= 0 then return now end
  if redis_now == nil then
    local time = redis.call('TIME')
    redis_now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return redis_now
end

-- The state of every key this script call has read, kept between its calls and written once at
-- the end: the calls on a hot key cost one read and one write per script call, not per call. A
-- held state is good for one operation, clock reading and parameter (sub-window, rate, window);
-- a call that differs (a test's own clock, a rate changed by a reload between two calls) writes
-- it back and reads again, and a refund writes it back first: every decision is the one the
-- calls would get one by one.
local held, held_keys = {}, {}

local function flush(key, h)
  if h.op == 1 then
    sliding_flush(key, h.s, h.now, h.p)
  elseif h.op == 2 then
    bucket_flush(key, h.s, h.now, h.p)
  else
    fixed_flush(key, h.s, h.now, h.p)
  end
end

local function release(key)
  local h = held[key]
  if h ~= nil then
    flush(key, h)
    held[key] = nil
  end
end

local function flush_all()
  for i = 1, #held_keys do release(held_keys[i]) end
end

local function state(key, op, now, p)
  local h = held[key]
  if h ~= nil and h.op == op and h.now == now and h.p == p then return h.s end
  if h ~= nil then flush(key, h) else held_keys[#held_keys + 1] = key end
  local s
  if op == 1 then
    s = sliding_open(key, now, p)
  elseif op == 2 then
    s = bucket_open(key, p)
  else
    s = fixed_open(key, now, p)
  end
  held[key] = {op = op, now = now, p = p, s = s}
  return s
end

local keys, a = KEYS, 3
local carried = tonumber(ARGV[2])
if carried > 0 then
  keys = {}
  local checked = {}
  for i = 1, carried do
    keys[i] = ARGV[2 + i]
    -- A hot key comes once per call: checked once.
    local here = checked[keys[i]] or redis.pcall('EXISTS', keys[i])
    checked[keys[i]] = here
    if type(here) == 'table' and here.err then
      return redis.error_reply('TRYAGAIN portcullis: a key of the batch is not served here: ' ..
        tostring(here.err))
    end
  end
  a = 3 + carried
end

-- Runs the operation whose six numbers start at ARGV[a] on keys[k].
local function run(k, a, now, commit)
  local op = tonumber(ARGV[a])
  local p, q, r, s, t = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
    tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local key = keys[k]
  -- A post-paid charge is its algorithm's charge that records what does not fit.
  local post_paid = op > 20
  if post_paid then op = op - 20 end
  if op == 1 then
    return sliding_window(state(key, 1, now, p), key, now, q, r, commit, post_paid)
  elseif op == 2 then
    return token_bucket(state(key, 2, now, p), now, q, r, s, t, p, commit, post_paid)
  elseif op == 3 then
    return fixed_window(state(key, 3, now, p), now, q, r, commit, post_paid)
  elseif op == 11 then
    release(key)
    return sliding_refund(key, now, p, r, commit)
  elseif op == 12 then
    release(key)
    return bucket_refund(key, now, p, q, r, commit)
  elseif op == 13 then
    release(key)
    return fixed_refund(key, now, p, r, commit)
  end
  return redis.error_reply('portcullis: unknown operation ' .. tostring(ARGV[a]))
end

local out = {}
local k = 1
for call = 1, tonumber(ARGV[1]) do
  local now, mode, count = clock(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local commit_charges = mode == 0
  if mode == 1 then
    -- Look first: a charge happens only if every charge of the call would pass.
    commit_charges = true
    for i = 0, count - 1 do
      local op = tonumber(ARGV[a + 6 * i])
      if op < 10 or op > 20 then
        local looked = run(k + i, a + 6 * i, now, false)
        if type(looked) == 'table' then flush_all() return looked end
        if string.byte(looked, 1) == 48 then commit_charges = false end -- '0': refused
      end
    end
  end
  local results = {}
  for i = 0, count - 1 do
    -- Refunds and post-paid charges apply whatever the call's other charges answer.
    local op = tonumber(ARGV[a + 6 * i])
    local always = op > 10
    local result = run(k + i, a + 6 * i, now, mode ~= 2 and (always or commit_charges))
    -- What earlier calls were admitted is written before the error goes back.
    if type(result) == 'table' then flush_all() return result end
    results[i + 1] = result
  end
  out[call] = table.concat(results, ',')
  a = a + 6 * count
  k = k + count
end
flush_all()
return table.concat(out, ';')
