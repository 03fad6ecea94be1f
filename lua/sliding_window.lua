-- sliding_open(key, now_us, sub_window_us, prefer_hash) -> state; sliding_window(state, key,
-- now_us, limit, hits, commit) -> reply; sliding_flush(key, state, now_us, sub_window_us);
-- sliding_refund(key, now_us, sub_window_us, hits, commit, prefer_hash); sliding_quick and
-- sliding_quick_hash (the cold path's usual check in each layout, at the end)
--
-- Two layouts of one state: packed (sliding_packed.lua, a string) and the hash below. A key is
-- read in the layout it is stored in, whatever the call prefers; a new key is made in the one the
-- call prefers (packed, unless --redis-layout hash: replicas of 0.1.0 read only hashes).
--
-- The state transition of algorithm::sliding_window, on a hash: one field per live sub-window
-- (its index since the epoch = the hits admitted in it), and three bookkeeping fields: `t` the
-- running total of those sub-windows, `n` the newest sub-window index the state has moved to,
-- `l` the newest sub-window holding hits. Every sub-window field lies in [n - SUB_WINDOWS, n]:
-- moving to a newer sub-window subtracts and deletes the fields that leave the window, so a call
-- reads a few fields, never all of them. A sub-window index below `n` (the clock stepped back,
-- e.g. a failover to a replica whose clock is behind) counts into `n`: never hand out budget
-- twice. Only admitted hits write (and delete the fields that left): a refusal, a call of no
-- hits, or `commit` false write nothing, as the memory store leaves its entry. The state is read
-- once and written once per key per script call (check.lua keeps it between the calls).
--
-- Replies (common.lua's `reply`) {1, now_us, total, l} when the hits pass
-- (Rust needs no more), and {0, now_us, total, l, index1, count1, index2, count2, ...} (the live
-- sub-windows) when they do not, for the retry time; Rust derives remaining/reset/retry with the memory store's code.
-- TTL: until the newest sub-window holding hits leaves the window, (l + SLOTS) * sub_window_us;
-- set when `l` moves, so a call within the same sub-window writes no TTL.

-- The state at sub-window `current`: total, the sub-window hits go to (newest), its count, the
-- newest sub-window holding hits (l, 0 when none), and the fields that left the window (to be
-- deleted by a write; nothing is written here).
local function hash_load(key, current, stored)
  -- (`stored`: these four fields as sliding_quick_hash read them, if it did.)
  stored = stored or redis.call('HMGET', key, 't', 'n', 'l', int(current))
  local total, n, last = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3])
  if n == nil then return 0, current, 0, 0, nil end
  if current == n then return total, n, tonumber(stored[4]) or 0, last, nil end
  if current < n then
    return total, n, tonumber(redis.call('HGET', key, int(n))) or 0, last, nil
  end
  if current - n >= SLOTS then
    -- Every sub-window has left: the key goes as a whole.
    return 0, current, 0, 0, true
  end
  -- Sub-windows n - SUB_WINDOWS .. current - SLOTS leave.
  local leaving = {}
  for index = n - SUB_WINDOWS, current - SLOTS do leaving[#leaving + 1] = index end
  if #leaving > 0 then
    local counts = redis.call('HMGET', key, unpack(leaving))
    for i = 1, #counts do total = total - (tonumber(counts[i]) or 0) end
  end
  if total <= 0 then last = 0 end
  return total, current, 0, last, leaving
end

-- The live (index, count) pairs at `newest`, for a refusal's retry time or a refund.
local function hash_pairs(key, newest)
  local raw = redis.call('HGETALL', key)
  local pairs = {}
  for i = 1, #raw, 2 do
    local index = tonumber(raw[i])
    local count = tonumber(raw[i + 1])
    if index ~= nil and index + SUB_WINDOWS >= newest and count > 0 then
      pairs[#pairs + 1] = index
      pairs[#pairs + 1] = count
    end
  end
  return pairs
end

-- The state of `key` at `now`, held by check.lua for every call of the script call at the same
-- clock reading: what was read, and what the admitted hits changed (only the newest sub-window,
-- the total and `l`), written once by sliding_flush.
local function hash_open(key, current, stored)
  local total, newest, count, last, leaving = hash_load(key, current, stored)
  return {layout = 'hash', total = total, newest = newest, count = count, last = last,
    loaded_last = last, leaving = leaving, dirty = false, stored = nil}
end

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

-- Writes what the admitted hits changed, if any: the fields that left go, the newest sub-window,
-- the total and the bookkeeping fields are set, and the TTL moves when `l` did.
local function hash_flush(key, s, now, sub_us)
  if s.leaving == true then
    redis.call('DEL', key)
  elseif s.leaving ~= nil and #s.leaving > 0 then
    redis.call('HDEL', key, unpack(s.leaving))
  end
  -- The newest sub-window's digits made once for its three places (Redis 7.0 prints each Lua
  -- number it is handed: common.lua's `int`).
  local newest = int(s.newest)
  redis.call('HSET', key, newest, int(s.count), 't', int(s.total), 'n', newest, 'l', newest)
  if s.loaded_last ~= s.newest then
    redis.call('PEXPIREAT', key, expire_at_ms(now, (s.newest + SLOTS) * sub_us - now))
  end
end

-- Writes what the admitted hits changed, in the key's layout.
local function sliding_flush(key, s, now, sub_us)
  if not s.dirty then return end
  if s.layout == 'hash' then return hash_flush(key, s, now, sub_us) end
  return packed_flush(key, s, now, sub_us)
end

-- A refund: `hits` taken back from the newest sub-windows first, never below zero
-- (algorithm::sliding_window::refund). Always allowed.
local function hash_refund(key, now, sub_us, current, hits, commit)
  local n = tonumber(redis.call('HGET', key, 'n'))
  local newest = current
  if n ~= nil and n > current then newest = n end
  local live = hash_pairs(key, newest)
  local total = 0
  for i = 2, #live, 2 do total = total + live[i] end
  local last = 0
  for i = 1, #live, 2 do if live[i] > last then last = live[i] end end
  if not commit then return reply(1, now, total, last) end
  -- Pairs are in hash order: take from the highest index down.
  local order = {}
  for i = 1, #live, 2 do order[#order + 1] = i end
  table.sort(order, function(a, b) return live[a] > live[b] end)
  local left = hits
  for _, i in ipairs(order) do
    if left <= 0 then break end
    local taken = math.min(left, live[i + 1])
    live[i + 1] = live[i + 1] - taken
    left = left - taken
  end
  -- Rewrite the state from what is left.
  redis.call('DEL', key)
  local fields, kept_total, kept_last = {}, 0, 0
  for i = 1, #live, 2 do
    if live[i + 1] > 0 then
      fields[#fields + 1] = live[i]
      fields[#fields + 1] = live[i + 1]
      kept_total = kept_total + live[i + 1]
      if live[i] > kept_last then kept_last = live[i] end
    end
  end
  if kept_total > 0 then
    redis.call('HSET', key, 't', kept_total, 'n', newest,
      'l', kept_last, unpack(fields))
    redis.call('PEXPIREAT', key, expire_at_ms(now, (kept_last + SLOTS) * sub_us - now))
  end
  return reply(1, now, kept_total, kept_last)
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

-- A hash met in a newer sub-window `current` while some of its own are live (n < current < n +
-- SLOTS), admitted: the sub-windows that leave read by one more HMGET and taken off the total,
-- deleted if any was stored, and the hits written as hash_load, sliding_window and hash_flush
-- would (sliding_quick_hash's contract; a refusal goes to `quick`, which answers the live ones).
local function sliding_quick_hash_newer(key, now, sub_us, limit, hits, stored, n, current, digits)
  local total, last = tonumber(stored[1]), tonumber(stored[3])
  -- Sub-windows n - SUB_WINDOWS .. current - SLOTS leave (at least one: current > n).
  local leaving = {}
  for index = n - SUB_WINDOWS, current - SLOTS do leaving[#leaving + 1] = int(index) end
  local counts = redis.pcall('HMGET', key, unpack(leaving))
  if counts.err then return nil, counts end
  local present = 0
  for i = 1, #counts do
    local count = tonumber(counts[i])
    if count ~= nil then
      total = total - count
      present = present + 1
      leaving[present] = leaving[i]
    end
  end
  if total <= 0 then last = 0 end
  if total + hits > limit then return nil, nil, stored end
  if hits > 0 then
    if present > 0 then
      local deleted = redis.pcall('HDEL', key, unpack(leaving, 1, present))
      if type(deleted) == 'table' then return nil, deleted end
    end
    total, last = total + hits, current
    local written = redis.pcall('HSET', key, digits, int(hits), 't', int(total), 'n', digits,
      'l', digits)
    if type(written) == 'table' then return nil, written end
    written = redis.pcall('PEXPIREAT', key, expire_at_ms(now, (current + SLOTS) * sub_us - now))
    if type(written) == 'table' then return nil, written end
  end
  local at = sink_n
  sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 1, now, total, last
  sink_n = at + 4
  return 1
end

-- The cold path's usual check on a key to be made a hash (`--redis-layout hash`, 0.1.0's), new,
-- met again in the sub-window it counts in or in a newer one while some of its own are live:
-- read by one HMGET (two for a newer sub-window), decided and written at once, as hash_open,
-- sliding_window and hash_flush would. Returns allowed; nil and the error for a key Redis could
-- not read or write; nil, nil and what HMGET read (nil: a string) for any other state (a refusal
-- with hits stored, which answers its live sub-windows; the clock behind the stored sub-window;
-- every sub-window gone), which `quick` decides.
local function sliding_quick_hash(key, now, sub_us, limit, hits)
  local current = (now - math.fmod(now, sub_us)) / sub_us
  local digits = int(current)
  local stored = redis.pcall('HMGET', key, 't', 'n', 'l', digits)
  if stored.err then
    if string.find(stored.err, 'WRONGTYPE', 1, true) then return nil, nil end
    return nil, stored
  end
  local total, count, last = 0, 0, 0
  local n = tonumber(stored[2])
  if n ~= nil then
    if n ~= current then
      if n < current and current - n < SLOTS then
        return sliding_quick_hash_newer(key, now, sub_us, limit, hits, stored, n, current, digits)
      end
      return nil, nil, stored
    end
    total, count, last = tonumber(stored[1]), tonumber(stored[4]) or 0, tonumber(stored[3])
  end
  local at = sink_n
  if total + hits > limit then
    -- A key stored answers its live sub-windows (`quick`); a new one nothing.
    if n ~= nil then return nil, nil, stored end
    sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 0, now, 0, 0
    sink_n = at + 4
    return 0
  end
  if hits > 0 then
    total, count = total + hits, count + hits
    local written = redis.pcall('HSET', key, digits, int(count), 't', int(total), 'n', digits,
      'l', digits)
    if type(written) == 'table' then return nil, written end
    if last ~= current then
      written = redis.pcall('PEXPIREAT', key, expire_at_ms(now, (current + SLOTS) * sub_us - now))
      if type(written) == 'table' then return nil, written end
    end
    last = current
  end
  sink[at + 1], sink[at + 2], sink[at + 3], sink[at + 4] = 1, now, total, last
  sink_n = at + 4
  return 1
end
