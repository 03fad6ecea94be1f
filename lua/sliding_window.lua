-- sliding_open(key, now_us, sub_window_us, prefer_hash) -> state; sliding_window(state, key,
-- now_us, limit, hits, commit) -> reply; sliding_flush(key, state, now_us, sub_window_us);
-- sliding_refund(key, now_us, sub_window_us, hits, commit, prefer_hash); sliding_quick (the cold
-- path's usual check on a packed key, at the end; sliding_hash.lua has the hash's).
--
-- Two layouts of one state: packed (sliding_packed.lua, a string) and the hash
-- (sliding_hash.lua). A key is read in the layout it is stored in, whatever the call prefers; a
-- new key is made in the one the call prefers (packed, unless --redis-layout hash: replicas of
-- 0.1.0 read only hashes). Never decides on a string Portcullis did not write.
--
-- Replies (common.lua's `reply`) {1, now_us, total, l} when the hits pass
-- (Rust needs no more), and {0, now_us, total, l, index1, count1, index2, count2, ...} (the live
-- sub-windows) when they do not, for the retry time; Rust derives remaining/reset/retry with the memory store's code.

-- Which layout `key` is stored in: its string (packed), or `nil, true` for a hash, or false when
-- it does not exist.
local function sliding_stored(key)
  local raw, is_hash = stored_string(key)
  -- A string Portcullis did not write (another program shares the prefix): never decided on.
  if raw and not packed_valid(raw) then not_a_counter() end
  return raw, is_hash
end

local function sliding_open(key, now, sub_us, prefer_hash)
  local current = (now - math.fmod(now, sub_us)) / sub_us
  local raw, is_hash = sliding_stored(key)
  if is_hash or (raw == false and prefer_hash) then return hash_open(key, current) end
  return packed_open(raw, current)
end

-- The live (index, count) pairs of what is stored, at the state's newest sub-window.
local function sliding_pairs(key, s)
  if s.layout == 'hash' then return hash_pairs(key, s.newest) end
  return packed_pairs(s.raw, s.newest)
end

local function sliding_window(s, key, now, limit, hits, commit, post_paid)
  -- A total past the limit (post-paid charges, a lowered limit) refuses even a check-only call.
  if s.total + hits > limit then
    if commit and post_paid and hits > 0 then
      -- Consumed already: recorded all the same, up to the sub-window's 32-bit ceiling.
      local before = s.count
      s.count = math.min(s.count + hits, 4294967295)
      s.total = s.total + (s.count - before)
      s.last = s.newest
      s.dirty = true
    end
    -- Refused: nothing changes. The live sub-windows as stored (read once per script call), the
    -- newest one as it stands now.
    if s.stored == nil then s.stored = sliding_pairs(key, s) end
    reply(0, now, s.total, s.last)
    for i = 1, #s.stored, 2 do
      if s.stored[i] ~= s.newest then reply_pair(s.stored[i], s.stored[i + 1]) end
    end
    if s.count > 0 then reply_pair(s.newest, s.count) end
    return 0
  end
  if commit and hits > 0 then
    s.count = s.count + hits
    s.total = s.total + hits
    s.last = s.newest
    s.dirty = true
  end
  return reply(1, now, s.total, s.last)
end

-- Writes what the admitted hits changed, in the key's layout.
local function sliding_flush(key, s, now, sub_us)
  if not s.dirty then return end
  if s.layout == 'hash' then return hash_flush(key, s, now, sub_us) end
  return packed_flush(key, s, now, sub_us)
end

local function sliding_refund(key, now, sub_us, hits, commit, prefer_hash)
  local current = (now - math.fmod(now, sub_us)) / sub_us
  local raw, is_hash = sliding_stored(key)
  if is_hash or (raw == false and prefer_hash) then
    return hash_refund(key, now, sub_us, current, hits, commit)
  end
  return packed_refund(key, raw, now, sub_us, current, hits, commit)
end

-- A short form met in a newer sub-window `current` while its own (`n`, `stored` hits) is live:
-- refused, or the two sub-windows written whole (`sliding_quick`'s contract).
local function sliding_quick_newer(key, now, sub_us, limit, hits, n, stored, current)
  local at = sink_n
  if stored + hits > limit then
    -- The total, the newest sub-window holding hits, the live ones: the stored one.
    sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 0, now, stored, n
    sink[at + 5], sink[at + 6] = n, stored
    sink_n = at + 6
    return 0
  end
  local total, last = stored, n
  if hits > 0 then
    total, last = stored + hits, current
    local written = redis.pcall('SET', key,
      packed_build_two(2, current, total, current, n, stored, current, hits), 'PXAT',
      expire_at_ms(now, (current + SLOTS) * sub_us - now))
    if written.err then return nil, written end
  end
  sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 1, now, total, last
  sink_n = at + 4
  return 1
end

-- The guess that keys are new, as fixed_quick's (fixed_window.lua says why).
local sliding_fresh = 0

-- The cold path's usual check (fixed_window.lua's fixed_quick says which) on a key to be made
-- packed, where the state is new or the short form's: read, decided and written at once, as
-- packed_open, sliding_window and packed_flush would. Returns allowed; nil and the error for a
-- key Redis could not read or write; nil, nil, and what GET read (nil: a hash) for any other
-- state (the full form), which `quick` decides.
local function sliding_quick(key, now, sub_us, limit, hits)
  local current = (now - math.fmod(now, sub_us)) / sub_us
  local raw
  -- A new key made by SET's NX with GET when the keys met lately were mostly new.
  if sliding_fresh > 7 and hits > 0 and hits <= limit and hits <= 4294967295
      and MAKE_WITH_GET then
    raw = redis.pcall('SET', key, struct.pack(SHORT, 1, current, hits), 'NX', 'PXAT',
      expire_at_ms(now, (current + SLOTS) * sub_us - now), 'GET')
    if raw == false then
      if sliding_fresh < 16 then sliding_fresh = sliding_fresh + 1 end
      local at = sink_n
      sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 1, now, hits, current
      sink_n = at + 4
      return 1
    end
    -- An error (a hash, a full Redis): read by GET, as without this.
    if type(raw) == 'table' then raw = nil end
  end
  if raw == nil then raw = redis.pcall('GET', key) end
  if type(raw) == 'table' then
    if string.find(raw.err, 'WRONGTYPE', 1, true) then return nil, nil, nil end
    return nil, raw
  end
  -- n, count: the sub-window counted in and its hits; kept: the stored expiry stands.
  local n, count, kept = current, 0, false
  if not raw then
    if sliding_fresh < 16 then sliding_fresh = sliding_fresh + 1 end
  elseif sliding_fresh > 0 then
    sliding_fresh = sliding_fresh - 1
  end
  if raw then
    if #raw ~= SHORT_BYTES or string.byte(raw, 1) ~= 1 then
      if not packed_valid(raw) then return nil, NOT_A_COUNTER end
      return nil, nil, raw
    end
    local _, stored_n, stored = struct.unpack(SHORT, raw)
    if current <= stored_n then
      -- Its sub-window, or the clock stepped back: hits count into the stored one.
      n, count, kept = stored_n, stored, true
    elseif current - stored_n < SLOTS then
      return sliding_quick_newer(key, now, sub_us, limit, hits, stored_n, stored, current)
    end
    -- Else every sub-window has left: as a new key.
  end
  local at = sink_n
  if count + hits > limit then
    -- Refused: the total, the newest sub-window holding hits and the live ones (its own).
    if count > 0 then
      sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 0, now, count, n
      sink[at + 5], sink[at + 6] = n, count
      sink_n = at + 6
    else
      sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 0, now, 0, 0
      sink_n = at + 4
    end
    return 0
  end
  if hits > 0 then
    -- The short form holds a count of 4 bytes.
    if count + hits > 4294967295 then return nil, nil, raw end
    count = count + hits
    local written
    if kept then
      written = redis.pcall('SET', key, struct.pack(SHORT, 1, n, count), 'KEEPTTL')
    else
      written = redis.pcall('SET', key, struct.pack(SHORT, 1, n, count), 'PXAT',
        expire_at_ms(now, (n + SLOTS) * sub_us - now))
    end
    if written.err then return nil, written end
  end
  local last = 0
  if count > 0 then last = n end
  sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 1, now, count, last
  sink_n = at + 4
  return 1
end
