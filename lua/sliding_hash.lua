-- The sliding window's hash layout (0.1.0's, `--redis-layout hash`): hash_open(key, current,
-- stored) -> state, hash_flush, hash_refund, hash_pairs, and the cold path's sliding_quick_hash
-- (at the end); sliding_window.lua picks the layout a key is stored in and decides. Never writes
-- a string, and never leaves a field outside the window (a busy key would grow).
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
