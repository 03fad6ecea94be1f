-- bucket_open(key, requests) -> state; token_bucket(state, now_us, cost_q, cost_r, tolerance_q,
-- tolerance_r, requests, commit, post_paid, claim_q, claim_r) -> reply; bucket_flush(key,
-- state, now_us, requests)
--
-- The state transition of algorithm::token_bucket (GCRA), on a hash {t = TAT whole microseconds,
-- f = fraction in units of 1/r us, r = the requests f is counted in}. Rust splits the cost
-- (hits * window / requests) and the tolerance (burst * window / requests) into quotient and
-- remainder with 128-bit integers, so this script only adds and compares integers below 2^53,
-- where Lua's doubles are exact. A fraction counted in another rate (a reload changed the rule's
-- number) is first rounded up to a whole microsecond, as `at_rate` does.
-- cost_q = -1 means the hits exceed the burst: refused without touching the state. Nothing is
-- written when `commit` is false, when the hits are refused, or when there are none; the state is
-- read once and written once per key per script call (check.lua keeps it between the calls).
--
-- Replies (common.lua's `reply`) {allowed (0|1), now_us, tat_us, frac}, the
-- state after the check (frac in `requests`).
-- TTL: until the bucket is full again (TAT), rounded up to the millisecond.
local function bucket_load(key, requests)
  local stored = redis.call('HMGET', key, 't', 'f', 'r')
  local tat, frac = tonumber(stored[1]) or 0, tonumber(stored[2]) or 0
  if frac > 0 and tonumber(stored[3]) ~= requests then tat, frac = tat + 1, 0 end
  return tat, frac
end

-- keep: kept at least until then (RLQS grants claim part of the bucket: check_claimed reads
-- its TAT past full), or nil.
local function bucket_store(key, now, requests, tat, frac, keep)
  redis.call('HSET', key, 't', int(tat), 'f', int(frac), 'r', int(requests))
  local ttl_us = tat - now
  if frac > 0 then ttl_us = ttl_us + 1 end
  if keep ~= nil and keep - now > ttl_us then ttl_us = keep - now end
  redis.call('PEXPIREAT', key, expire_at_ms(now, ttl_us))
end

-- The bucket of `key` in `requests`, held by check.lua for every call of the script call at
-- the same clock reading and rate; written once by bucket_flush.
local function bucket_open(key, requests)
  local tat, frac = bucket_load(key, requests)
  return {tat = tat, frac = frac, dirty = false}
end

-- The bucket (tat, frac) as if the RLQS grants had drawn their claim (span claim_q, claim_r):
-- algorithm::token_bucket::check_claimed. No state is taken as just full (now).
local function claimed_bucket(tat, frac, now, claim_q, claim_r, requests)
  if tat == 0 and frac == 0 then tat = now end
  frac = frac + claim_r
  if frac >= requests then tat, frac = tat + 1, frac - requests end
  return tat + claim_q, frac
end

-- (tat, frac) moved back by the claims' span: the state kept in check_claimed's frame.
local function unclaimed(tat, frac, claim_q, claim_r, requests)
  local borrow = 0
  if frac < claim_r then borrow = 1 end
  return tat - claim_q - borrow, frac + borrow * requests - claim_r
end

-- claim_q, claim_r: the span of what RLQS grants claim of the bucket (nil: none counted); the
-- check is decided, spent and answered on the bucket as if they had drawn it, and the state
-- kept without it (algorithm::token_bucket::check_claimed, record_claimed).
local function token_bucket(s, now, cost_q, cost_r, tol_q, tol_r, requests, commit, post_paid,
    claim_q, claim_r)
  local tat, frac = s.tat, s.frac
  if claim_q ~= nil then
    tat, frac = claimed_bucket(tat, frac, now, claim_q, claim_r, requests)
  end
  if cost_q < 0 then return reply(0, now, tat, frac) end
  local base_t, base_f = now, 0
  if tat > now or (tat == now and frac > 0) then base_t, base_f = tat, frac end
  local next_f = base_f + cost_r
  local carry = 0
  if next_f >= requests then carry = 1 end
  next_f = next_f - carry * requests
  local next_t = base_t + cost_q + carry
  local ahead = next_t - now
  if ahead < tol_q or (ahead == tol_q and next_f <= tol_r) then
    -- Nothing spent (no hits), or only looking: nothing changes.
    if not commit or (cost_q == 0 and cost_r == 0) then return reply(1, now, tat, frac) end
    if claim_q ~= nil then
      s.tat, s.frac = unclaimed(next_t, next_f, claim_q, claim_r, requests)
    else
      s.tat, s.frac = next_t, next_f
    end
    s.dirty = true
    return reply(1, now, next_t, next_f)
  end
  if commit and post_paid and (cost_q > 0 or cost_r > 0) then
    -- Consumed already: TAT moves on all the same, at most 2^52 us ahead of now
    -- (token_bucket::MAX_SPAN_US).
    if ahead > 4503599627370496 then next_t, next_f = now + 4503599627370496, 0 end
    if claim_q ~= nil then
      s.tat, s.frac = unclaimed(next_t, next_f, claim_q, claim_r, requests)
    else
      s.tat, s.frac = next_t, next_f
    end
    s.dirty = true
    return reply(0, now, next_t, next_f)
  end
  return reply(0, now, tat, frac)
end

local function bucket_flush(key, s, now, requests)
  if s.dirty then bucket_store(key, now, requests, s.tat, s.frac, s.keep) end
end

-- bucket_refund(key, now_us, requests, back_q, back_r, commit): TAT moves earlier by the span of
-- the hits given back, never before now (algorithm::token_bucket::refund). Always allowed.
local function bucket_refund(key, now, requests, back_q, back_r, commit)
  local tat, frac = bucket_load(key, requests)
  if not commit then return reply(1, now, tat, frac) end
  local borrow = 0
  if frac < back_r then borrow = 1 end
  frac = frac + borrow * requests - back_r
  tat = tat - back_q - borrow
  if tat < now or (tat == now and frac == 0) then
    redis.call('DEL', key)
    return reply(1, now, 0, 0)
  end
  bucket_store(key, now, requests, tat, frac)
  return reply(1, now, tat, frac)
end
