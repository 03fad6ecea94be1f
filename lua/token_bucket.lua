-- bucket_open(key, requests, prefer_hash) -> state; token_bucket(state, now_us, cost_q, cost_r, tolerance_q,
-- tolerance_r, requests, commit, post_paid, claim_q, claim_r) -> reply; bucket_flush(key,
-- state, now_us, requests)
--
-- The state transition of algorithm::token_bucket (GCRA), on {t = TAT whole microseconds, f =
-- fraction in units of 1/r us, r = the requests f is counted in}. Rust splits the cost
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
--
-- Stored as a string (one SET with its expiry) of big-endian 64-bit integers, t alone when f is
-- 0, else t, f, r; or as 0.1.0's hash {t, f, r} (common.lua's layouts).
local function bucket_read(key, prefer_hash)
  if prefer_hash then
    local stored = redis.pcall('HMGET', key, 't', 'f', 'r')
    if stored.err == nil then return stored, true end
    if not string.find(stored.err, 'WRONGTYPE', 1, true) then error(stored) end
  end
  local raw, is_hash = stored_string(key)
  if is_hash then return redis.call('HMGET', key, 't', 'f', 'r'), true end
  if not raw then return {}, prefer_hash end
  if #raw == 8 then return {(struct.unpack('>i8', raw))}, false end
  if #raw ~= 24 then not_a_counter() end
  return {struct.unpack('>i8i8i8', raw)}, false
end

-- The bucket's TAT and fraction in `requests`, and whether the key is (or is to be made) a hash.
local function bucket_load(key, requests, prefer_hash)
  local stored, is_hash = bucket_read(key, prefer_hash)
  local tat, frac = tonumber(stored[1]) or 0, tonumber(stored[2]) or 0
  if frac > 0 and tonumber(stored[3]) ~= requests then tat, frac = tat + 1, 0 end
  return tat, frac, is_hash
end

-- keep: kept at least until then (RLQS grants claim part of the bucket: check_claimed reads
-- its TAT past full), or nil.
local function bucket_store(key, now, requests, tat, frac, keep, is_hash)
  local ttl_us = tat - now
  if frac > 0 then ttl_us = ttl_us + 1 end
  if keep ~= nil and keep - now > ttl_us then ttl_us = keep - now end
  if not is_hash then
    local value
    if frac == 0 then
      value = struct.pack('>i8', tat)
    else
      value = struct.pack('>i8i8i8', tat, frac, requests)
    end
    redis.call('SET', key, value, 'PXAT', expire_at_ms(now, ttl_us))
    return
  end
  redis.call('HSET', key, 't', int(tat), 'f', int(frac), 'r', int(requests))
  redis.call('PEXPIREAT', key, expire_at_ms(now, ttl_us))
end

-- The bucket of `key` in `requests`, held by check.lua for every call of the script call at
-- the same clock reading and rate; written once by bucket_flush.
local function bucket_open(key, requests, prefer_hash)
  local tat, frac, is_hash = bucket_load(key, requests, prefer_hash)
  return {tat = tat, frac = frac, hash = is_hash, dirty = false}
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
  if s.dirty then bucket_store(key, now, requests, s.tat, s.frac, s.keep, s.hash) end
end

-- bucket_refund(key, now_us, requests, back_q, back_r, commit, prefer_hash): TAT moves earlier by the span of
-- the hits given back, never before now (algorithm::token_bucket::refund). Always allowed.
local function bucket_refund(key, now, requests, back_q, back_r, commit, prefer_hash)
  local tat, frac, is_hash = bucket_load(key, requests, prefer_hash)
  if not commit then return reply(1, now, tat, frac) end
  local borrow = 0
  if frac < back_r then borrow = 1 end
  frac = frac + borrow * requests - back_r
  tat = tat - back_q - borrow
  if tat < now or (tat == now and frac == 0) then
    redis.call('DEL', key)
    return reply(1, now, 0, 0)
  end
  bucket_store(key, now, requests, tat, frac, nil, is_hash)
  return reply(1, now, tat, frac)
end

-- The cold path's usual check (fixed_window.lua's fixed_quick says which): a charge each alone,
-- not post-paid, no claims counted, in the layout its new key is to be made in (`hash`: 0.1.0's).
-- Returns allowed; nil and the error for a key Redis could not read or write; nil, nil for a key
-- stored in the other layout.
local function bucket_quick(key, now, requests, cost_q, cost_r, tol_q, tol_r, hash)
  local tat, frac = 0, 0
  if hash then
    local fields = redis.pcall('HMGET', key, 't', 'f', 'r')
    if fields.err then
      if string.find(fields.err, 'WRONGTYPE', 1, true) then return nil, nil end
      return nil, fields
    end
    tat, frac = tonumber(fields[1]) or 0, tonumber(fields[2]) or 0
    if frac > 0 and tonumber(fields[3]) ~= requests then tat, frac = tat + 1, 0 end
  else
    local raw
    if cost_q >= 0 and cost_q + cost_r > 0 and MAKE_WITH_GET then
      -- A bucket's key lives only while the bucket is not full (its TTL is its charges' time),
      -- so the usual charge, a user's who calls less often, meets none: it is made by one
      -- command, SET's NX with GET, where a GET and a SET took two, if it fits a full bucket; a
      -- key still there is read by it, as GET would. (A window's key lives its window, met
      -- again by anyone who calls twice in it: fixed_quick and sliding_quick take this way only
      -- while the keys they met lately were mostly new.)
      local next_t, next_f = now + cost_q, cost_r
      if next_f >= requests then next_t, next_f = next_t + 1, next_f - requests end
      local ahead = next_t - now
      if ahead < tol_q or (ahead == tol_q and next_f <= tol_r) then
        if next_f > 0 then
          raw = redis.pcall('SET', key, struct.pack('>i8i8i8', next_t, next_f, requests), 'NX',
            'PXAT', expire_at_ms(now, ahead + 1), 'GET')
        else
          raw = redis.pcall('SET', key, struct.pack('>i8', next_t), 'NX', 'PXAT',
            expire_at_ms(now, ahead), 'GET')
        end
        if raw == false then
          -- Made: the charge on a full bucket.
          local n = sink_n
          sink[n + 1], sink[n + 2], sink[n + 3], sink[n + 4] = 1, now, next_t, next_f
          sink_n = n + 4
          return 1
        end
        -- An error (a hash, a full Redis): read by GET, as without this.
        if type(raw) == 'table' then raw = redis.pcall('GET', key) end
      end
    end
    if raw == nil then raw = redis.pcall('GET', key) end
    if raw then
      if type(raw) == 'table' then
        if string.find(raw.err, 'WRONGTYPE', 1, true) then return nil, nil end
        return nil, raw
      end
      if #raw == 8 then
        tat = struct.unpack('>i8', raw)
      elseif #raw == 24 then
        local rate
        tat, frac, rate = struct.unpack('>i8i8i8', raw)
        if frac > 0 and rate ~= requests then tat, frac = tat + 1, 0 end
      else
        return nil, NOT_A_COUNTER
      end
    end
  end
  local n = sink_n
  sink_n = n + 4
  sink[n + 1], sink[n + 2], sink[n + 3], sink[n + 4] = 0, now, tat, frac
  if cost_q < 0 then return 0 end
  local next_t, next_f = now + cost_q, cost_r
  if tat > now or (tat == now and frac > 0) then next_t, next_f = tat + cost_q, frac + cost_r end
  if next_f >= requests then next_t, next_f = next_t + 1, next_f - requests end
  local ahead = next_t - now
  if ahead > tol_q or (ahead == tol_q and next_f > tol_r) then return 0 end
  sink[n + 1] = 1
  -- Nothing spent (no hits): nothing changes.
  if cost_q == 0 and cost_r == 0 then return 1 end
  local ttl_us = ahead
  if next_f > 0 then ttl_us = ahead + 1 end
  local written
  if hash then
    -- What Redis answers: a number, or a table holding `err`.
    written = redis.pcall('HSET', key, 't', int(next_t), 'f', int(next_f), 'r', int(requests))
    if type(written) == 'table' then return nil, written end
    written = redis.pcall('PEXPIREAT', key, expire_at_ms(now, ttl_us))
    if type(written) == 'table' then return nil, written end
  else
    if next_f == 0 then
      written = redis.pcall('SET', key, struct.pack('>i8', next_t), 'PXAT',
        expire_at_ms(now, ttl_us))
    else
      written = redis.pcall('SET', key, struct.pack('>i8i8i8', next_t, next_f, requests), 'PXAT',
        expire_at_ms(now, ttl_us))
    end
    if written.err then return nil, written end
  end
  sink[n + 3], sink[n + 4] = next_t, next_f
  return 1
end
