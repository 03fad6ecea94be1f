-- fixed_open(key, now_us, window_us) -> state; fixed_window(state, now_us, limit, hits, commit)
-- -> reply; fixed_flush(key, state, now_us, window_us)
--
-- The state transition of algorithm::fixed_window, on a hash {w = window index since the epoch,
-- c = hits admitted in it}. A window index below the stored one (the clock stepped back) keeps
-- counting in the stored window. Nothing is written when `commit` is false, when the hits are
-- refused, or when there are none; the state is read once and written once per key per script
-- call (check.lua keeps it between the calls).
--
-- Replies (common.lua's `reply`) {allowed (0|1), now_us, window, count}, the
-- state after the check.
-- TTL: until the window ends.
local function fixed_load(key, now, window_us)
  local current = (now - math.fmod(now, window_us)) / window_us
  local stored = redis.call('HMGET', key, 'w', 'c')
  local stored_window = tonumber(stored[1])
  local window, count = stored_window or 0, tonumber(stored[2]) or 0
  if current > window then window, count = current, 0 end
  return window, count, stored_window
end

-- The expiry is the window's end, the same for every write within a window: set only when the
-- stored window changes (or the key is new).
local function fixed_store(key, now, window_us, window, count, stored_window)
  if count > 0 then
    redis.call('HSET', key, 'w', int(window), 'c', int(count))
    if stored_window ~= window then
      redis.call('PEXPIREAT', key, expire_at_ms(now, (window + 1) * window_us - now))
    end
  else
    redis.call('DEL', key)
  end
end

-- The counter of `key` at `now`, held by check.lua for every call of the script call at the
-- same clock reading; written once by fixed_flush.
local function fixed_open(key, now, window_us)
  local window, count, stored_window = fixed_load(key, now, window_us)
  return {window = window, count = count, stored_window = stored_window, dirty = false}
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
  if s.dirty then fixed_store(key, now, window_us, s.window, s.count, s.stored_window) end
end

-- fixed_refund(key, now_us, window_us, hits, commit): `hits` back to the current window's
-- counter, never below zero (algorithm::fixed_window::refund). Always allowed.
local function fixed_refund(key, now, window_us, hits, commit)
  local window, count, stored_window = fixed_load(key, now, window_us)
  if commit then
    -- Written even when nothing was left to give back: an older window's count is dropped
    -- (the key is deleted), as the memory store drops its entry.
    count = math.max(count - hits, 0)
    fixed_store(key, now, window_us, window, count, stored_window)
  end
  return reply(1, now, window, count)
end
