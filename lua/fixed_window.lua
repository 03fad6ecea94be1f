-- fixed_open(key, now_us, window_us, prefer_hash) -> state; fixed_window(state, now_us, limit,
-- hits, commit) -> reply; fixed_flush(key, state, now_us, window_us); fixed_quick (below)
--
-- The state transition of algorithm::fixed_window on {window index since the epoch, hits
-- admitted in it}, stored as a string of two big-endian 64-bit integers (one SET with its
-- expiry) or as 0.1.0's hash {w, c} (common.lua's layouts). A window index below the stored one
-- (the clock stepped back) keeps counting in the stored window. Nothing is written when `commit`
-- is false, when the hits are refused, or when there are none; the state is read once and
-- written once per key per script call (check.lua keeps it between the calls).
--
-- Replies (common.lua's `reply`) {allowed (0|1), now_us, window, count}, the
-- state after the check.
-- TTL: until the window ends.
local FIXED = '>i8i8'
local FIXED_BYTES = 16

-- The stored window (nil: none), its count, and whether the key is (or is to be made) a hash.
local function fixed_read(key, prefer_hash)
  if prefer_hash then
    local stored = redis.pcall('HMGET', key, 'w', 'c')
    if stored.err == nil then return tonumber(stored[1]), tonumber(stored[2]) or 0, true end
    if not string.find(stored.err, 'WRONGTYPE', 1, true) then error(stored) end
  end
  local raw, is_hash = stored_string(key)
  if is_hash then
    local stored = redis.call('HMGET', key, 'w', 'c')
    return tonumber(stored[1]), tonumber(stored[2]) or 0, true
  end
  if not raw then return nil, 0, prefer_hash end
  if #raw ~= FIXED_BYTES then not_a_counter() end
  local window, count = struct.unpack(FIXED, raw)
  return window, count, false
end

local function fixed_load(key, now, window_us, prefer_hash)
  local current = (now - math.fmod(now, window_us)) / window_us
  local stored_window, count, is_hash = fixed_read(key, prefer_hash)
  local window = stored_window or 0
  if current > window then window, count = current, 0 end
  return window, count, stored_window, is_hash
end

-- The expiry is the window's end, the same for every write within a window: set only when the
-- stored window changes (or the key is new).
local function fixed_store(key, now, window_us, window, count, stored_window, is_hash)
  if count <= 0 then
    redis.call('DEL', key)
  elseif not is_hash then
    if stored_window ~= window then
      redis.call('SET', key, struct.pack(FIXED, window, count), 'PXAT',
        expire_at_ms(now, (window + 1) * window_us - now))
    else
      redis.call('SET', key, struct.pack(FIXED, window, count), 'KEEPTTL')
    end
  else
    redis.call('HSET', key, 'w', int(window), 'c', int(count))
    if stored_window ~= window then
      redis.call('PEXPIREAT', key, expire_at_ms(now, (window + 1) * window_us - now))
    end
  end
end

-- The counter of `key` at `now`, held by check.lua for every call of the script call at the
-- same clock reading; written once by fixed_flush.
local function fixed_open(key, now, window_us, prefer_hash)
  local window, count, stored_window, is_hash = fixed_load(key, now, window_us, prefer_hash)
  return {window = window, count = count, stored_window = stored_window, hash = is_hash,
    dirty = false}
end

local function fixed_window(s, now, limit, hits, commit, post_paid)
  -- A count past the limit (post-paid charges, a lowered limit) refuses even a check-only call.
  if s.count + hits <= limit then
    if hits > 0 and commit then
      s.count = s.count + hits
      s.dirty = true
    end
    return reply(1, now, s.window, s.count)
  end
  if commit and post_paid and hits > 0 then
    -- Consumed already: recorded all the same, up to 2^52 (fixed_window::MAX_COUNT).
    s.count = math.min(s.count + hits, 4503599627370496)
    s.dirty = true
  end
  return reply(0, now, s.window, s.count)
end

local function fixed_flush(key, s, now, window_us)
  if s.dirty then
    fixed_store(key, now, window_us, s.window, s.count, s.stored_window, s.hash)
  end
end

-- fixed_refund(key, now_us, window_us, hits, commit, prefer_hash): `hits` back to the current
-- window's counter, never below zero (algorithm::fixed_window::refund). Always allowed.
local function fixed_refund(key, now, window_us, hits, commit, prefer_hash)
  local window, count, stored_window, is_hash = fixed_load(key, now, window_us, prefer_hash)
  if commit then
    -- Written even when nothing was left to give back: an older window's count is dropped
    -- (the key is deleted), as the memory store drops its entry.
    count = math.max(count - hits, 0)
    fixed_store(key, now, window_us, window, count, stored_window, is_hash)
  end
  return reply(1, now, window, count)
end

-- A packed window's key is made by SET's NX with GET (one command: a new key made, or the stored
-- one read without a write) when the keys met lately were mostly new, and read first by GET
-- otherwise: a new key costs 0.9 of a GET and a SET that way, one met again 1.1 (BENCHMARKS.md).
-- The guess is a count kept per algorithm in the function library while Redis keeps it (under
-- EVALSHA: for one script call), one up for a key met new and one down for one met stored,
-- within [0, 16]; at 8 or more, keys are guessed new (literals: a named constant is an upvalue
-- read per decision). Only what a decision costs depends on it, never the decision.
local fixed_fresh = 0

-- The cold path's usual check, a charge each alone on a key no other check of the script call
-- names: read, decided and written at once, without a state table or pcall (a Lua pcall and a
-- table cost as much as the decision), in the layout its new key is to be made in (`hash`:
-- 0.1.0's). Returns allowed; nil and the error for a key Redis could not read or write (nothing
-- of it is answered); nil, nil when the key is stored in the other layout (`quick` decides it).
local function fixed_quick(key, now, window_us, limit, hits, hash)
  local current = (now - math.fmod(now, window_us)) / window_us
  local count, kept = 0, false
  local stored_window, stored
  -- (Redis' errors read inline, here and in the other quick functions: a shared function for
  -- them cost 1,000 instructions a decision.)
  if hash then
    local fields = redis.pcall('HMGET', key, 'w', 'c')
    if fields.err then
      if string.find(fields.err, 'WRONGTYPE', 1, true) then return nil, nil end
      return nil, fields
    end
    stored_window, stored = tonumber(fields[1]), tonumber(fields[2]) or 0
  else
    local raw
    if fixed_fresh > 7 and hits > 0 and hits <= limit and MAKE_WITH_GET then
      raw = redis.pcall('SET', key, struct.pack(FIXED, current, hits), 'NX', 'PXAT',
        expire_at_ms(now, (current + 1) * window_us - now), 'GET')
      if raw == false then
        -- Made: the charge on a new window.
        if fixed_fresh < 16 then fixed_fresh = fixed_fresh + 1 end
        local n = sink_n
        sink[n + 1], sink[n + 2], sink[n + 3], sink[n + 4] = 1, now, current, hits
        sink_n = n + 4
        return 1
      end
      -- An error (a hash, a full Redis): read by GET, as without this.
      if type(raw) == 'table' then raw = nil end
    end
    if raw == nil then raw = redis.pcall('GET', key) end
    if raw then
      if type(raw) == 'table' then
        if string.find(raw.err, 'WRONGTYPE', 1, true) then return nil, nil end
        return nil, raw
      end
      if #raw ~= FIXED_BYTES then return nil, NOT_A_COUNTER end
      stored_window, stored = struct.unpack(FIXED, raw)
      if fixed_fresh > 0 then fixed_fresh = fixed_fresh - 1 end
    elseif fixed_fresh < 16 then
      fixed_fresh = fixed_fresh + 1
    end
  end
  -- The stored window's expiry stands while it is the one counted in.
  if stored_window ~= nil and stored_window >= current then
    current, count, kept = stored_window, stored, true
  end
  local n = sink_n
  if count + hits > limit then
    sink[n + 1], sink[n + 2], sink[n + 3], sink[n + 4] = 0, now, current, count
    sink_n = n + 4
    return 0
  end
  if hits > 0 then
    -- What Redis answers: a status or a number, or a table holding `err`.
    local written
    if hash then
      written = redis.pcall('HSET', key, 'w', int(current), 'c', int(count + hits))
      if type(written) == 'table' then return nil, written end
      if not kept then
        written = redis.pcall('PEXPIREAT', key, expire_at_ms(now, (current + 1) * window_us - now))
        if type(written) == 'table' then return nil, written end
      end
    else
      if kept then
        written = redis.pcall('SET', key, struct.pack(FIXED, current, count + hits), 'KEEPTTL')
      else
        written = redis.pcall('SET', key, struct.pack(FIXED, current, count + hits), 'PXAT',
          expire_at_ms(now, (current + 1) * window_us - now))
      end
      if written.err then return nil, written end
    end
    count = count + hits
  end
  sink[n + 1], sink[n + 2], sink[n + 3], sink[n + 4] = 1, now, current, count
  sink_n = n + 4
  return 1
end
