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
--   the call's deadline on Redis' clock in microseconds, or 0: a call that reaches Redis after
--       it (its caller has been answered by the failure mode) is not run, its keys answered
--       '!EXPIRED' (a reading more than a minute past it means the caller's estimate of Redis'
--       clock is stale: the call runs);
--   the call's mode: 0 each check charged alone, 1 all or nothing (if any charge would be
--       refused, no charge is made; refunds apply), 2 probe (nothing is written), 3 the look of
--       an all-or-nothing call (what 1 would answer, nothing written: Cluster's first step when
--       a call's keys live in several slots);
--   its number of keys;
--   for each of its keys, the operation (1 sliding, 2 bucket, 3 fixed; 11, 12, 13 the same
--       algorithms' refunds; 21, 22, 23 their post-paid charges: hits already consumed, recorded
--       even when they do not fit, the reply still saying whether they did; 4 a blocked
--       descriptor, refused) and five numbers whose meaning is the operation's (see `run`).
-- Returns one string: '@' and the node's clock in microseconds and '|' when the script read
-- TIME (so that every reply, even one whose calls all expired, tells Portcullis this node's
-- clock), then the calls separated by ';', each call's keys by ',', each key's numbers by
-- ' ' (common.lua's `reply`), as each algorithm function documents; or, for a key Redis could not
-- decide or write (a write refused for memory, a key of another type), '!' and the error. Such an
-- error fails only the keys it concerns (every key of an all-or-nothing call): the other calls'
-- answers stand, refusals included, and what they admitted is written. READONLY (a demoted
-- master: no write can have happened) ends the script call as an error, for Cluster to follow.
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

-- Keys that failed: failed[call][i] = the error of the call's key i; failed[call].all for every
-- key of the call. `fatal`: an error that must end the script call.
local failed, fatal = {}, nil

local function error_text(e)
  if type(e) == 'table' then e = e.err end
  -- The reply's separators cannot appear inside an entry.
  return (string.gsub(tostring(e), '[;,]', ' '))
end

local function fail(call, i, e)
  local text = error_text(e)
  if string.sub(text, 1, 8) == 'READONLY' then fatal = fatal or text end
  local f = failed[call]
  if f == nil then f = {} failed[call] = f end
  if i == nil then f.all = f.all or text else f[i] = f[i] or text end
end

-- Writes a held state; a refused write fails the keys whose charges it carried.
local function flush(key, h)
  local ok, e = pcall(function()
    if h.op == 1 then
      sliding_flush(key, h.s, h.now, h.p)
    elseif h.op == 2 then
      bucket_flush(key, h.s, h.now, h.p)
    else
      fixed_flush(key, h.s, h.now, h.p)
    end
  end)
  if not ok then
    for _, w in ipairs(h.writers) do fail(w[1], w[2], e) end
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
  if h ~= nil and h.op == op and h.now == now and h.p == p then return h end
  if h ~= nil then flush(key, h) held[key] = nil else held_keys[#held_keys + 1] = key end
  local s
  if op == 1 then
    s = sliding_open(key, now, p)
  elseif op == 2 then
    s = bucket_open(key, p)
  else
    s = fixed_open(key, now, p)
  end
  h = {op = op, now = now, p = p, s = s, writers = {}}
  held[key] = h
  return h
end

-- An all-or-nothing call looks at its charges on copies of the held states, charging them there
-- in order: two checks of one call on one key see each other's hits, as they will when charged.
local function scratch_state(scratch, key, op, now, p)
  local c = scratch[key]
  if c ~= nil and c.op == op and c.now == now and c.p == p then return c end
  local copy = {}
  for name, value in pairs(state(key, op, now, p).s) do copy[name] = value end
  c = {op = op, now = now, p = p, s = copy}
  scratch[key] = c
  return c
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

-- Runs the operation whose six numbers start at ARGV[a] on keys[k], key `i` of call `call`; on
-- `scratch` copies when given (an all-or-nothing look). Raises Redis' errors (run under pcall).
-- The six numbers: the operation, then per operation:
--   1 sliding: sub-window us, limit, hits        11 its refund: sub-window us, limit, hits
--   2 bucket: rate, cost us, cost remainder,     12 its refund: rate, span us, span remainder
--     tolerance us, tolerance remainder
--   3 fixed: window us, limit, hits              13 its refund: window us, limit, hits
--   21, 22, 23: 1, 2, 3 as post-paid charges.   4 blocked (a zero limit): always refused.
local function run(k, a, now, commit, call, i, scratch)
  local op = tonumber(ARGV[a])
  local key = keys[k]
  if op == 11 or op == 12 or op == 13 then
    release(key)
    local unit, n1, n2 = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    if op == 11 then return sliding_refund(key, now, unit, n2, commit) end
    if op == 12 then return bucket_refund(key, now, unit, n1, n2, commit) end
    return fixed_refund(key, now, unit, n2, commit)
  end
  -- A post-paid charge is its algorithm's charge that records what does not fit.
  local post_paid = op > 20
  if post_paid then op = op - 20 end
  -- A blocked descriptor (a zero limit) in an all-or-nothing call: refused, its key untouched.
  if op == 4 then return reply(0, now, 0, 0) end
  if op ~= 1 and op ~= 2 and op ~= 3 then
    error({err = 'ERR portcullis: unknown operation ' .. tostring(ARGV[a])})
  end
  local unit = tonumber(ARGV[a + 1])
  local h
  if scratch ~= nil then h = scratch_state(scratch, key, op, now, unit) else h = state(key, op, now, unit) end
  local s = h.s
  -- Whether this check changes the state: it then shares the fate of the state's write.
  local was_dirty = s.dirty
  s.dirty = false
  local ok, result = pcall(function()
    if op == 1 then
      local limit, hits = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
      return sliding_window(s, key, now, limit, hits, commit, post_paid)
    elseif op == 2 then
      local cost_q, cost_r = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
      local tol_q, tol_r = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
      return token_bucket(s, now, cost_q, cost_r, tol_q, tol_r, unit, commit, post_paid)
    end
    local limit, hits = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    return fixed_window(s, now, limit, hits, commit, post_paid)
  end)
  if s.dirty and scratch == nil then h.writers[#h.writers + 1] = {call, i} end
  s.dirty = s.dirty or was_dirty
  if not ok then error(result, 0) end
  return result
end

local out, counts, modes = {}, {}, {}
local k = 1
for call = 1, tonumber(ARGV[1]) do
  local now, expires = clock(ARGV[a]), tonumber(ARGV[a + 1])
  local mode, count = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 4
  counts[call], modes[call] = count, mode
  local commit_charges = mode == 0
  local decided = true
  if expires > 0 and now > expires and now - expires < 60000000 then
    fail(call, nil, 'EXPIRED portcullis: the call reached Redis after its deadline; not run')
    decided = false
  end
  local looks = {}
  if decided and (mode == 1 or mode == 3) then
    -- Look first, on copies: a charge happens only if every charge of the call would pass.
    commit_charges = true
    local scratch = {}
    for i = 0, count - 1 do
      local op = tonumber(ARGV[a + 6 * i])
      if op < 10 or op > 20 then
        local ok, looked = pcall(run, k + i, a + 6 * i, now, true, call, i + 1, scratch)
        if not ok then
          -- Undecidable as a whole: nothing of it is charged.
          fail(call, nil, looked)
          decided = false
          break
        end
        looks[i + 1] = looked
        if string.byte(looked, 1) == 48 then commit_charges = false end -- '0': refused
      end
    end
  end
  local results = {}
  if decided then
    for i = 0, count - 1 do
      -- Refunds and post-paid charges apply whatever the call's other charges answer.
      local op = tonumber(ARGV[a + 6 * i])
      local always = op > 10
      local commit = (mode == 0 or mode == 1) and (always or commit_charges)
      local looked = looks[i + 1]
      if looked ~= nil and (mode == 3 or not commit) and string.byte(looked, 1) == 48 then
        -- Refused as a whole: a charge the look refused answers so (the second of two checks
        -- on one key is refused there, not alone); the others answer as a probe would.
        results[i + 1] = looked
      else
        local ok, result = pcall(run, k + i, a + 6 * i, now, commit, call, i + 1)
        if ok then results[i + 1] = result else fail(call, i + 1, result) end
      end
    end
  end
  out[call] = results
  a = a + 6 * count
  k = k + count
end
flush_all()
if fatal ~= nil then return redis.error_reply(fatal) end
for call = 1, #out do
  local f = failed[call]
  if f ~= nil then
    local results = out[call]
    -- All or nothing: a key that failed leaves the whole call undecided.
    local whole = f.all
    if whole == nil and (modes[call] == 1 or modes[call] == 3) then
      for i = 1, counts[call] do whole = whole or f[i] end
    end
    for i = 1, counts[call] do
      local e = whole or f[i]
      if e ~= nil then results[i] = '!' .. e end
    end
  end
  out[call] = table.concat(out[call], ',')
end
if redis_now ~= nil then return string.format('@%d|', redis_now) .. table.concat(out, ';') end
return table.concat(out, ';')
