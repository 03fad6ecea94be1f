-- token_bucket(key, now_us, requests, cost_q, cost_r, tolerance_q, tolerance_r)
--
-- The state transition of algorithm::token_bucket (GCRA), on a hash {t = TAT whole microseconds,
-- f = fraction in units of 1/r us, r = the requests f is counted in}. Rust splits the cost
-- (hits * window / requests) and the tolerance (burst * window / requests) into quotient and
-- remainder with 128-bit integers, so this script only adds and compares integers below 2^53,
-- where Lua's doubles are exact. A fraction counted in another rate (a reload changed the rule's
-- number) is first rounded up to a whole microsecond, as `at_rate` does.
-- cost_q = -1 means the hits exceed the burst: refused without touching the state.
--
-- Returns {allowed (0|1), now_us, tat_us, frac} (the state after the check, frac in `requests`).
-- TTL: until the bucket is full again (TAT), rounded up to the millisecond.
local function token_bucket(key, now, requests, cost_q, cost_r, tol_q, tol_r)
  local stored = redis.call('HMGET', key, 't', 'f', 'r')
  local tat, frac = tonumber(stored[1]) or 0, tonumber(stored[2]) or 0
  if frac > 0 and tonumber(stored[3]) ~= requests then tat, frac = tat + 1, 0 end
  if cost_q < 0 then return {0, now, tat, frac} end
  local base_t, base_f = now, 0
  if tat > now or (tat == now and frac > 0) then base_t, base_f = tat, frac end
  local next_f = base_f + cost_r
  local carry = 0
  if next_f >= requests then carry = 1 end
  next_f = next_f - carry * requests
  local next_t = base_t + cost_q + carry
  local ahead = next_t - now
  if ahead < tol_q or (ahead == tol_q and next_f <= tol_r) then
    redis.call('HSET', key, 't', string.format('%.0f', next_t), 'f', string.format('%.0f', next_f),
      'r', string.format('%.0f', requests))
    local ttl_us = ahead
    if next_f > 0 then ttl_us = ttl_us + 1 end
    redis.call('PEXPIREAT', key, expire_at_ms(now, ttl_us))
    return {1, now, next_t, next_f}
  end
  return {0, now, tat, frac}
end
