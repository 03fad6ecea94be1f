-- The sliding window's packed layout: one string per key, a third of the hash layout's memory
-- (a busy minute key: about 136 bytes of value instead of a 64-field hash). Used by
-- sliding_window.lua's functions for a key that holds a string, or that does not exist yet when
-- the call prefers it (every call, unless --redis-layout hash).
--
-- Layout (big-endian integers):
--   byte 1        the width of a sub-window's count, 2 or 4 bytes (4 once a count passes 65535),
--                 or 1: the short form (below)
--   bytes 2-7     n: the newest sub-window index the state has moved to
--   bytes 8-13    t: the running total of the live sub-windows
--   byte 14       n - l (l: the newest sub-window holding hits), 255 when there is none
--   then SLOTS counts, the count of sub-window i at slot i mod SLOTS; only the sub-windows
--   n - SUB_WINDOWS .. n are live, the other slots are stale until overwritten.
-- The short form: while every live hit is in the newest sub-window (l = n), the value is 11
-- bytes: 1, then n (6 bytes) and its count (4 bytes; a count never passes 2^32 - 1). Most keys
-- of a rule keyed by user are met once or within a second: they cost Redis no more than a fixed
-- window's key (11 bytes keep the value in Redis' smallest allocation with its object; the
-- header alone would take the next). A short value is read as the full one it stands for, and
-- the full form is written as soon as an older sub-window's hits stay live beside newer ones.
-- It decides exactly as the hash layout does (the same state, encoded): moving to a newer
-- sub-window subtracts the slots it takes over, reading only those.
local SUB_WINDOWS = 60
local SLOTS = SUB_WINDOWS + 1
local PACKED_HEAD = 14
local NO_LAST = 255

-- Big-endian unsigned integers with Redis' `struct` library (one C call each; building bytes one
-- by one in Lua cost a new key ~25 us).
local UNSIGNED = {[2] = '>I2', [4] = '>I4', [6] = '>I6'}
local HEADER = '>I1I6I6I1'
local SHORT, SHORT_BYTES = '>I1I6I4', 11

local function be_read(raw, pos, len)
  return (struct.unpack(UNSIGNED[len], raw, pos))
end

local function be_bytes(v, len)
  return struct.pack(UNSIGNED[len], v)
end

-- `n` zero bytes. Each length is made once, cut from one string of SLOTS widest counts, and
-- kept: string.rep adds its string once a repetition (118 zero bytes cost Redis ~9,000
-- instructions) and a new string costs ~2,500 (a sliding key's rebuild ~33,000 with them). Made
-- at first use (a function library cannot reach `string` while it loads); constants, right in
-- any later call, at most SLOTS * 4 of them.
local zero_bytes, zero_runs = nil, {}
local function zeros(n)
  local run = zero_runs[n]
  if run == nil then
    if zero_bytes == nil then zero_bytes = string.rep('\0', SLOTS * 4) end
    run = string.sub(zero_bytes, 1, n)
    zero_runs[n] = run
  end
  return run
end

local function packed_slot_pos(index, width)
  return PACKED_HEAD + 1 + (index % SLOTS) * width
end

local function packed_count(raw, width, index)
  return be_read(raw, packed_slot_pos(index, width), width)
end

-- The header of a packed value.
local function packed_header(width, n, total, last)
  local d = NO_LAST
  if last > 0 and total > 0 then d = n - last end
  return struct.pack(HEADER, width, n, total, d)
end

-- Whether a stored string is a packed counter: its width and its length agree.
local function packed_valid(raw)
  local width = string.byte(raw, 1)
  if width == 1 then return #raw == SHORT_BYTES end
  return (width == 2 or width == 4) and #raw == PACKED_HEAD + SLOTS * width
end

-- What a stored value says: width, n, total, l.
local function packed_read_header(raw)
  local width, n, total, d = struct.unpack(HEADER, raw)
  local last = 0
  if d ~= NO_LAST then last = n - d end
  return width, n, total, last
end

-- A whole value of two live sub-windows, the newest (i2, c2) and an older one (i1, c1; nil for
-- none), every other slot zero: packed_build's value without its tables (a table and its growth
-- cost Redis ~3,000 instructions; the usual rebuild, a short form made whole beside a newer
-- sub-window, ~30,000 with them).
local function packed_build_two(width, n, total, last, i1, c1, i2, c2)
  if c2 > 65535 or (c1 ~= nil and c1 > 65535) then width = 4 end
  local head, s2 = packed_header(width, n, total, last), i2 % SLOTS
  if i1 == nil or c1 == 0 or i1 == i2 then
    return head .. zeros(s2 * width) .. be_bytes(c2, width) .. zeros((SLOTS - 1 - s2) * width)
  end
  local s1 = i1 % SLOTS
  local low, c_low, high, c_high = s1, c1, s2, c2
  if s2 < s1 then low, c_low, high, c_high = s2, c2, s1, c1 end
  return head .. zeros(low * width) .. be_bytes(c_low, width) ..
    zeros((high - low - 1) * width) .. be_bytes(c_high, width) ..
    zeros((SLOTS - 1 - high) * width)
end

-- A whole value from (index, count) pairs, every other slot zero (runs of zero slots made at
-- once: a new key is one count among zeros).
local function packed_build(width, n, total, last, pairs)
  local at, slots = {}, {}
  for i = 1, #pairs, 2 do
    local index, count = pairs[i], pairs[i + 1]
    if count > 65535 then width = 4 end
    local slot = index % SLOTS
    if at[slot] == nil then slots[#slots + 1] = slot end
    at[slot] = count
  end
  local parts, run = {packed_header(width, n, total, last)}, 0
  if #slots <= 8 then
    -- A few live sub-windows (a key met now and then, its short form made whole): their slots in
    -- order with the zeros between, not a step per slot (a Lua step costs Redis ~50 instructions).
    table.sort(slots)
    local from = 0
    for k = 1, #slots do
      local slot = slots[k]
      local count = at[slot]
      if count ~= 0 then
        if slot > from then parts[#parts + 1] = zeros((slot - from) * width) end
        parts[#parts + 1] = be_bytes(count, width)
        from = slot + 1
      end
    end
    if from < SLOTS then parts[#parts + 1] = zeros((SLOTS - from) * width) end
    return table.concat(parts)
  end
  for slot = 0, SLOTS - 1 do
    local count = at[slot]
    if count ~= nil and count ~= 0 then
      if run > 0 then parts[#parts + 1] = zeros(run * width) end
      run = 0
      parts[#parts + 1] = be_bytes(count, width)
    else
      run = run + 1
    end
  end
  if run > 0 then parts[#parts + 1] = zeros(run * width) end
  return table.concat(parts)
end

-- The full form a stored value stands for (a short value made whole, for a refund; any other
-- as it is).
local function packed_expand(raw)
  if not raw or string.byte(raw, 1) ~= 1 then return raw end
  local _, n, count = struct.unpack(SHORT, raw)
  return packed_build(2, n, count, n, {n, count})
end

-- What is written for (index, count) pairs: the short form when sub-window n holds every hit,
-- else the full one.
local function packed_value(width, n, total, last, pairs)
  if #pairs == 2 and pairs[1] == n and total == pairs[2] then
    return struct.pack(SHORT, 1, n, total)
  end
  return packed_build(width, n, total, last, pairs)
end

-- The state at sub-window `current` of a stored value (`raw`, false when the key is new).
local function packed_open(raw, current)
  local s = {layout = 'packed', raw = raw, width = 2, total = 0, newest = current, count = 0,
    last = 0, loaded_last = 0, cleared = nil, dirty = false, stored = nil, stored_n = nil}
  if not raw then return s end
  if string.byte(raw, 1) == 1 then
    -- The short form, read without making it whole: sub-window n holds every hit, and no slot
    -- taken over before all have left holds any.
    local _, n, count = struct.unpack(SHORT, raw)
    s.stored_n, s.loaded_last = n, n
    if current <= n then
      s.total, s.newest, s.count, s.last = count, n, count, n
    elseif current - n >= SLOTS then
      s.total, s.newest, s.count, s.last, s.cleared = 0, current, 0, 0, true
    else
      s.total, s.newest, s.count, s.last, s.cleared = count, current, 0, n, {n + 1, current}
    end
    return s
  end
  local width, n, total, last = packed_read_header(raw)
  s.width, s.stored_n, s.loaded_last = width, n, last
  if current <= n then
    -- The same sub-window, or the clock stepped back: hits count into n.
    s.total, s.newest, s.count, s.last = total, n, packed_count(raw, width, n), last
  elseif current - n >= SLOTS then
    -- Every sub-window has left.
    s.total, s.newest, s.count, s.last, s.cleared = 0, current, 0, 0, true
  else
    -- Sub-windows n + 1 .. current take over the slots of those that leave.
    for index = n + 1, current do total = total - packed_count(raw, width, index) end
    if total <= 0 then last = 0 end
    s.total, s.newest, s.count, s.last = total, current, 0, last
    s.cleared = {n + 1, current}
  end
  return s
end

-- The live (index, count) pairs of the stored value at `newest` (a refusal's retry time, a
-- refund).
local function packed_pairs(raw, newest)
  local out = {}
  if not raw then return out end
  if string.byte(raw, 1) == 1 then
    local _, n, count = struct.unpack(SHORT, raw)
    if n + SUB_WINDOWS >= newest then out = {n, count} end
    return out
  end
  local width, n = packed_read_header(raw)
  local from = math.max(n - SUB_WINDOWS, newest - SUB_WINDOWS, 0)
  for index = from, n do
    local count = packed_count(raw, width, index)
    if count > 0 then
      out[#out + 1] = index
      out[#out + 1] = count
    end
  end
  return out
end

-- Writes what the admitted hits changed: the slots taken over are zeroed, the newest one set,
-- the header rewritten; the TTL moves when `l` did (SET would drop it otherwise: KEEPTTL), in
-- the same command (PXAT: a new key is one command).
local function packed_flush(key, s, now, sub_us)
  local raw
  local small = s.count <= 65535 and s.width == 2
  if s.total == s.count and s.count > 0 then
    -- Every live hit in the newest sub-window: the short form.
    raw = struct.pack(SHORT, 1, s.newest, s.count)
  elseif s.raw and s.cleared ~= true and small and string.byte(s.raw, 1) ~= 1 and
      (s.cleared == nil or s.cleared[1] == s.cleared[2]) then
    -- The usual case: one slot changes (the newest, taken over or not) and the header.
    local pos = packed_slot_pos(s.newest, 2)
    raw = packed_header(2, s.newest, s.total, s.last) ..
      string.sub(s.raw, PACKED_HEAD + 1, pos - 1) .. be_bytes(s.count, 2) ..
      string.sub(s.raw, pos + 2)
  elseif s.raw and s.cleared ~= true and string.byte(s.raw, 1) == 1 then
    -- A short form met again in a newer sub-window while its own is live: the two.
    local _, stored_n, stored_count = struct.unpack(SHORT, s.raw)
    raw = packed_build_two(s.width, s.newest, s.total, s.last, stored_n, stored_count, s.newest,
      s.count)
  else
    -- Rebuilt from the live sub-windows (several taken over, a wider count, a new key).
    local live = {}
    if s.raw and s.cleared ~= true then
      local stored = packed_pairs(s.raw, s.newest)
      for i = 1, #stored, 2 do
        if stored[i] ~= s.newest then
          live[#live + 1] = stored[i]
          live[#live + 1] = stored[i + 1]
        end
      end
    end
    live[#live + 1] = s.newest
    live[#live + 1] = s.count
    local width = s.width
    if s.count > 65535 then width = 4 end
    raw = packed_build(width, s.newest, s.total, s.last, live)
  end
  if s.raw and s.loaded_last == s.newest then
    redis.call('SET', key, raw, 'KEEPTTL')
  else
    redis.call('SET', key, raw, 'PXAT', expire_at_ms(now, (s.newest + SLOTS) * sub_us - now))
  end
end

-- A refund on a packed value (`raw`, false when none): `hits` taken back from the newest
-- sub-windows first, never below zero.
local function packed_refund(key, raw, now, sub_us, current, hits, commit)
  raw = packed_expand(raw)
  local newest = current
  if raw then
    local _, n = packed_read_header(raw)
    if n > current then newest = n end
  end
  local live = packed_pairs(raw, newest)
  local total, last = 0, 0
  for i = 1, #live, 2 do
    total = total + live[i + 1]
    if live[i] > last then last = live[i] end
  end
  if not commit then return reply(1, now, total, last) end
  -- Pairs are oldest first: take from the end.
  local left = hits
  for i = #live - 1, 1, -2 do
    if left <= 0 then break end
    local taken = math.min(left, live[i + 1])
    live[i + 1] = live[i + 1] - taken
    left = left - taken
  end
  local kept, kept_total, kept_last = {}, 0, 0
  for i = 1, #live, 2 do
    if live[i + 1] > 0 then
      kept[#kept + 1] = live[i]
      kept[#kept + 1] = live[i + 1]
      kept_total = kept_total + live[i + 1]
      if live[i] > kept_last then kept_last = live[i] end
    end
  end
  if kept_total > 0 then
    local width = 2
    if raw then width = string.byte(raw, 1) end
    redis.call('SET', key, packed_value(width, newest, kept_total, kept_last, kept), 'PXAT',
      expire_at_ms(now, (kept_last + SLOTS) * sub_us - now))
  elseif raw then
    redis.call('DEL', key)
  end
  return reply(1, now, kept_total, kept_last)
end
