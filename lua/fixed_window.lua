-- fixed_window(key, now_us, window_us, limit, hits)
--
-- The state transition of limiter::fixed_window, on a hash {w = window index since the epoch,
-- c = hits admitted in it}. A window index below the stored one (the clock stepped back) keeps
-- counting in the stored window.
--
-- Returns {allowed (0|1), now_us, window, count} (the state after the check).
-- TTL: until the window ends.
local function fixed_window(key, now, window_us, limit, hits)
  local current = (now - math.fmod(now, window_us)) / window_us
  local stored = redis.call('HMGET', key, 'w', 'c')
  local window, count = tonumber(stored[1]) or 0, tonumber(stored[2]) or 0
  if current > window then window, count = current, 0 end
  if hits <= math.max(limit - count, 0) then
    if hits > 0 then
      count = count + hits
      redis.call('HSET', key, 'w', string.format('%.0f', window), 'c', string.format('%.0f', count))
      local ttl_us = (window + 1) * window_us - now
      redis.call('PEXPIREAT', key, expire_at_ms(now, ttl_us))
    end
    return {1, now, window, count}
  end
  return {0, now, window, count}
end
