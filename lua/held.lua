-- The state of one script call of check.lua (loaded just before it): the clock it read, the
-- keys' states it has read and must write back, the keys that failed. check.lua's `check` resets
-- all of it at each call (as a function library these locals live between calls); nothing here
-- may keep anything from one script call to the next.

-- Redis TIME, read once per script call (reset by `check`).
local redis_now = nil
local function clock(now)
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
local held, held_keys = nil, nil

-- Keys that failed: failed[call][i] = the error of the call's key i; failed[call].all for every
-- key of the call. `fatal`: an error that must end the script call.
local failed, fatal = nil, nil

local function error_text(e)
  if type(e) == 'table' then e = e.err end
  return tostring(e)
end

local function fail(call, i, e)
  local text = error_text(e)
  if string.sub(text, 1, 8) == 'READONLY' then fatal = fatal or text end
  local f = failed[call]
  if f == nil then f = {} failed[call] = f end
  if i == nil then f.all = f.all or text else f[i] = f[i] or text end
end

local function flush_state(key, h)
  if h.op == 1 then
    sliding_flush(key, h.s, h.now, h.p)
  elseif h.op == 2 then
    bucket_flush(key, h.s, h.now, h.p)
  elseif h.op == 6 then
    concurrency_flush(key, h.s, h.now)
  else
    fixed_flush(key, h.s, h.now, h.p)
  end
end

-- Writes a held state; a refused write fails the keys whose charges it carried. A state nothing
-- changed writes nothing (each flush function says so too); pcall with the function itself, not
-- a closure per key.
local function flush(key, h)
  if not h.s.dirty then return end
  local ok, e = pcall(flush_state, key, h)
  if not ok then
    if h.wc then fail(h.wc, h.wi, e) end
    local w = h.more
    if w then
      for j = 1, #w, 2 do fail(w[j], w[j + 1], e) end
    end
  end
end

local function write_back(key)
  local h = held[key]
  if h ~= nil then
    flush(key, h)
    held[key] = nil
  end
end

local function flush_all()
  for i = 1, #held_keys do write_back(held_keys[i]) end
end

local function state(key, op, now, p, prefer_hash)
  local h = held[key]
  if h ~= nil and h.op == op and h.now == now and h.p == p then return h end
  if h ~= nil then flush(key, h) held[key] = nil else held_keys[#held_keys + 1] = key end
  local s
  if op == 1 then
    s = sliding_open(key, now, p, prefer_hash)
  elseif op == 2 then
    s = bucket_open(key, p, prefer_hash)
  elseif op == 6 then
    s = concurrency_open(key, now)
  else
    s = fixed_open(key, now, p, prefer_hash)
  end
  -- wc, wi: the first call and key that changed it; more: any others, as flat pairs (most keys
  -- have one writer: no table for it).
  h = {op = op, now = now, p = p, s = s, wc = false, wi = 0, more = nil}
  held[key] = h
  return h
end

-- A charge of the sliding window, the bucket or the fixed window, each alone
-- (no claims counted, not post-paid), on a key no other check of the script call names: the
-- state read, decided and written at once, as `state` and `flush` would, without holding it (the
-- cold path: a rule keyed by user meets a new counter on almost every call). A refused write
-- raises, failing the key (`entry`), as a held state's failed write fails its writers. `raw`: the
-- sliding window's string as sliding_quick read it, or its hash's fields as sliding_quick_hash
-- did, if either did.
local function quick(op, key, now, unit, n2, n3, n4, n5, prefer_hash, raw)
  local s, result
  if op == 3 then
    s = fixed_open(key, now, unit, prefer_hash)
    result = fixed_window(s, now, n2, n3, true, false)
    fixed_flush(key, s, now, unit)
  elseif op == 2 then
    s = bucket_open(key, unit, prefer_hash)
    result = token_bucket(s, now, n2, n3, n4, n5, unit, true, false, nil, nil)
    bucket_flush(key, s, now, unit)
  else
    if type(raw) == 'table' then
      -- A hash's fields as sliding_quick_hash read them.
      s = hash_open(key, (now - math.fmod(now, unit)) / unit, raw)
    elseif raw then
      -- Read and checked by sliding_quick already.
      s = packed_open(raw, (now - math.fmod(now, unit)) / unit)
    else
      s = sliding_open(key, now, unit, prefer_hash)
    end
    result = sliding_window(s, key, now, n2, n3, true, false)
    sliding_flush(key, s, now, unit)
  end
  return result
end

-- An all-or-nothing call looks at its charges on copies of the held states, charging them there
-- in order: two checks of one call on one key see each other's hits, as they will when charged.
local function scratch_state(scratch, key, op, now, p, prefer_hash)
  local c = scratch[key]
  if c ~= nil and c.op == op and c.now == now and c.p == p then return c end
  local copy = {}
  for name, value in pairs(state(key, op, now, p, prefer_hash).s) do copy[name] = value end
  c = {op = op, now = now, p = p, s = copy}
  scratch[key] = c
  return c
end

