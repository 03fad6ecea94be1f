-- sliding_window(key, now_us, sub_window_us, limit, hits, commit)
--
-- The state transition of algorithm::sliding_window, on a hash: field = sub-window index since the
-- epoch, value = hits admitted in it. Sub-windows older than the newest minus SUB_WINDOWS are
-- deleted; the sum of the rest plus `hits` must stay within `limit` for the hits to be added to
-- the newest sub-window. A sub-window index below the newest stored one (the clock stepped back,
-- e.g. a failover to a replica whose clock is behind) counts into the newest: never hand out
-- budget twice. With `commit` false nothing is written: the answer says whether the hits would
-- pass, and the state is the one stored.
--
-- Returns {allowed (0|1), now_us, index1, count1, index2, count2, ...} for the live sub-windows;
-- Rust derives remaining/reset/retry from that with the same code the memory store uses.
-- TTL: until the newest non-empty sub-window leaves the window, (newest + SLOTS) * sub_window_us.
local SUB_WINDOWS = 10
local SLOTS = SUB_WINDOWS + 1

-- The live sub-windows of `key` (deleting the stale ones when `commit`): a list of index, count
-- pairs, their sum, and the newest index (at least `current`).
local function sliding_load(key, current, commit)
  local raw = redis.call('HGETALL', key)
  local newest = current
  for i = 1, #raw, 2 do
    local index = tonumber(raw[i])
    if index > newest then newest = index end
  end
  local used, live, stale = 0, {}, {}
  for i = 1, #raw, 2 do
    local index, count = tonumber(raw[i]), tonumber(raw[i + 1])
    if index + SUB_WINDOWS >= newest and count > 0 then
      used = used + count
      live[#live + 1] = index
      live[#live + 1] = count
    else
      stale[#stale + 1] = raw[i]
    end
  end
  if commit and #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  return live, used, newest
end

local function sliding_reply(allowed, now, live)
  local out = {allowed, now}
  for i = 1, #live do out[#out + 1] = live[i] end
  return out
end

local function sliding_window(key, now, sub_us, limit, hits, commit)
  local current = (now - math.fmod(now, sub_us)) / sub_us
  local live, used, newest = sliding_load(key, current, commit)
  local allowed = 0
  if hits <= math.max(limit - used, 0) then
    allowed = 1
    if hits > 0 and commit then
      local field = string.format('%.0f', newest)
      redis.call('HINCRBY', key, field, hits)
      local merged = false
      for i = 1, #live, 2 do
        if live[i] == newest then
          live[i + 1] = live[i + 1] + hits
          merged = true
        end
      end
      if not merged then
        live[#live + 1] = newest
        live[#live + 1] = hits
      end
      local ttl_us = (newest + SLOTS) * sub_us - now
      redis.call('PEXPIREAT', key, expire_at_ms(now, ttl_us))
    end
  end
  return sliding_reply(allowed, now, live)
end

-- sliding_refund(key, now_us, sub_window_us, hits, commit): `hits` taken back from the newest
-- sub-windows first, never below zero (algorithm::sliding_window::refund). Always allowed.
local function sliding_refund(key, now, sub_us, hits, commit)
  local current = (now - math.fmod(now, sub_us)) / sub_us
  local live, _, _ = sliding_load(key, current, commit)
  if not commit then return sliding_reply(1, now, live) end
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
    local field = string.format('%.0f', live[i])
    if live[i + 1] > 0 then
      redis.call('HSET', key, field, string.format('%.0f', live[i + 1]))
    else
      redis.call('HDEL', key, field)
    end
  end
  local kept, newest = {}, nil
  for i = 1, #live, 2 do
    if live[i + 1] > 0 then
      kept[#kept + 1] = live[i]
      kept[#kept + 1] = live[i + 1]
      if newest == nil or live[i] > newest then newest = live[i] end
    end
  end
  if newest == nil then
    redis.call('DEL', key)
  else
    redis.call('PEXPIREAT', key, expire_at_ms(now, (newest + SLOTS) * sub_us - now))
  end
  return sliding_reply(1, now, kept)
end
