-- check: the checks of one or more calls, in one script call (one round trip): the calls of a
-- batch, applied in order, each decided on its own, each key's state read once and written once.
-- Appended to the algorithm files, which define the functions it dispatches to, and held.lua (the
-- script call's state).
--
-- KEYS: the counter keys, each once (a hot key comes once however many calls name it: Redis
-- makes a string of each declared key); in Cluster mode all of one slot.
-- ARGV[1]: every number below, each a big-endian signed 64-bit integer, read with Redis' `struct`
--       library: parsing decimal arguments (`tonumber`, one Redis string each) was the largest
--       part of the script's cost per check.
-- ARGV[2..]: the keys carried in ARGV instead of KEYS, if any (a Cluster batch over several slots
--       of one node: KEYS then holds only the first key, which routes the call; Redis refuses
--       declared keys of several slots). Each is first checked to be this node's and not half
--       migrated away, before anything is read or written: if one is not, the script replies
--       TRYAGAIN having done nothing, and Portcullis sends the calls one by one (see
--       cluster_batch.rs).
-- The numbers: the number of calls; the number of keys carried in ARGV (0 for none); then, per
-- call:
--   a clock reading in microseconds for tests, or 0: Redis TIME (production always sends 0;
--       replicas' host clocks drift, Redis' clock is the one all of them share; read once per
--       script call);
--   the call's deadline on Redis' clock in microseconds, or 0: a call that reaches Redis after
--       it (its caller has been answered by the failure mode) is not run, its keys answered
--       '!EXPIRED' (a reading more than a minute past it means the caller's estimate of Redis'
--       clock is stale: the call runs);
--   the call's mode: 0 each check charged alone, 1 all or nothing (if any charge would be
--       refused, no charge is made; refunds apply), 2 probe (nothing is written), 3 the look of
--       an all-or-nothing call (what 1 would answer, nothing written: Cluster's first step when
--       a call's keys live in several slots), 4 the same as 0 for a call of one check whose key
--       no other check of the script call names (its quick path);
--   its number of keys;
--   for each of its keys, seven numbers: the operation (1 sliding, 2 bucket, 3 fixed, 6
--       concurrency; 11, 12, 13, 16 the same algorithms' refunds (16: slots released); 21, 22,
--       23 their post-paid charges: hits already consumed, recorded even when they do not fit,
--       the reply still saying whether they did; 5, 15, 25, 7, 17, 27, 8, 18, 28 the sliding
--       window's 1, 11, 21, the bucket's 2, 12, 22 and the fixed window's 3, 13, 23 whose new
--       keys are made as hashes, 0.1.0's layout (common.lua's HASH_OPS); 4 a blocked
--       descriptor, refused; 1, 2, 3, 5, 7, 8, 21, 22, 23, 25, 27, 28 plus 100 plus 1000 times
--       the window in milliseconds: the charge
--       counts the RLQS grants' claims on its descriptor, claims.lua, and its reply ends with
--       one more number, 0 when no gateway holds any of it, else 1 + what they claim), five
--       numbers whose meaning is the operation's (see `run`), and where
--       its key is in KEYS (or in the carried keys), from 1, negated when no other check of the
--       script call names that key (`quick`).
-- Returns numbers, as one binary string of big-endian 64-bit integers when every key was decided,
-- else as an array of integers and strings: the node's clock in microseconds when the script
-- read TIME, else 0 (every reply, even one whose calls all expired, tells Portcullis this node's
-- clock); then per call its number of keys and per key either its reply's length and its numbers
-- (common.lua's `reply`, as each algorithm function documents) or, for a key Redis could not
-- decide or write (a write refused for memory, a key of another type), the error as a string. Such an error fails only the keys it concerns (every key
-- of an all-or-nothing call): the other calls' answers stand, refusals included, and what they
-- admitted is written. READONLY (a demoted master: no write can have happened) ends the script
-- call as an error, for Cluster to follow.
-- struct.unpack, taken at each call: a function library cannot reach `struct` while it loads.
local read_numbers = nil
-- The script call's own: its numbers (ARGV[1]) and its keys, set by `check` at each call.
local numbers, keys = nil, nil
-- The formats of one number, of a call's four, of a key's seven; the bytes of the last two.
local NUMBER, CALL_HEAD, KEY_NUMBERS = '>i8', '>i8i8i8i8', '>i8i8i8i8i8i8i8'
local CALL_HEAD_BYTES, KEY_BYTES = 32, 56

-- Runs the operation whose seven numbers start at byte `a` of ARGV[1] on its key, key `i` of call
-- `call`; on `scratch` copies when given (an all-or-nothing look). It writes when the call may
-- write (`charging`: not a probe or a look) and it is a refund or a post-paid charge, or
-- `commit_charges` (the call's charges all pass, or are each their own). Raises Redis' errors
-- (run under pcall).
-- The numbers: the operation, then per operation (the seventh: where the key is):
--   1 sliding: sub-window us, limit, hits        11 its refund: sub-window us, limit, hits
--   2 bucket: rate, cost us, cost remainder,     12 its refund: rate, span us, span remainder
--     tolerance us, tolerance remainder
--   3 fixed: window us, limit, hits              13 its refund: window us, limit, hits
--   6 concurrency: lease us, slots, hits         16 its release: lease us, slots, hits
--   21, 22, 23: 1, 2, 3 as post-paid charges.   4 blocked (a zero limit): always refused.
local function run(a, now, charging, commit_charges, call, i, scratch)
  local op, unit, n2, n3, n4, n5, at = read_numbers(KEY_NUMBERS, numbers, a)
  -- A place sent negated: no other check of the script call names this key.
  if at < 0 then
    at = -at
    local plain, prefer_hash = op, false
    if HASH_OPS[op] then plain, prefer_hash = HASH_OPS[op], true end
    if plain <= 3 and plain >= 1 and charging and commit_charges and scratch == nil
      and held[keys[at]] == nil then
      return quick(plain, keys[at], now, unit, n2, n3, n4, n5, prefer_hash)
    end
  end
  local key = keys[at]
  -- A charge that counts the grants' claims: a window's limit less what they claim of it; a
  -- bucket decided as if they had drawn it (claim_q, claim_r: its span) and kept while they
  -- are (keep).
  local held = nil
  local claim_q, claim_r, keep = nil, nil, nil
  if op >= 100 then
    local window = math.floor(op / 1000) * 1000
    op = op % 1000 - 100
    local list = claims_on(key, now)
    held = 0
    if list then
      -- 1 sliding (5, 21, 25 too), 2 bucket (7, 22, 27), 3 fixed (8, 23, 28).
      local algorithm = op % 20
      algorithm = HASH_OPS[algorithm] or algorithm
      local claimed = claimed_of(list, algorithm, window, now)
      held = claimed + 1
      if algorithm == 2 then
        -- token_bucket::span_of(claimed): whole microseconds and a remainder in `unit`.
        local scaled = claimed * window
        claim_q = math.floor(scaled / unit)
        claim_r = scaled - claim_q * unit
        keep = 0
        for k = 1, #list do keep = math.max(keep, list[k].keep) end
      else
        n2 = math.max(n2 - claimed, 0)
      end
    end
  end
  local commit = charging and (commit_charges or op > 10)
  -- 5, 7, 8 (15, 17, 18; 25, 27, 28): 1, 2, 3 (11, 12, 13; 21, 22, 23) whose new keys are made
  -- in the hash layout.
  local prefer_hash = false
  if HASH_OPS[op] then op, prefer_hash = HASH_OPS[op], true end
  if op == 11 or op == 12 or op == 13 or op == 16 then
    write_back(key)
    if op == 11 then return sliding_refund(key, now, unit, n3, commit, prefer_hash) end
    if op == 12 then return bucket_refund(key, now, unit, n2, n3, commit, prefer_hash) end
    if op == 16 then return concurrency_refund(key, now, n3, commit) end
    return fixed_refund(key, now, unit, n3, commit, prefer_hash)
  end
  -- A post-paid charge is its algorithm's charge that records what does not fit.
  local post_paid = op > 20
  if post_paid then op = op - 20 end
  -- A blocked descriptor (a zero limit) in an all-or-nothing call: refused, its key untouched.
  if op == 4 then return reply(0, now, 0, 0) end
  if op ~= 1 and op ~= 2 and op ~= 3 and op ~= 6 then
    error({err = 'ERR portcullis: unknown operation ' .. tostring(op)})
  end
  local h
  if scratch ~= nil then
    h = scratch_state(scratch, key, op, now, unit, prefer_hash)
  else
    h = state(key, op, now, unit, prefer_hash)
  end
  local s = h.s
  -- Whether this check changes the state: it then shares the fate of the state's write.
  local was_dirty = s.dirty
  s.dirty = false
  -- pcall with the function itself (a closure per check was a large part of its cost), where the
  -- function can raise (it reads Redis): the state's earlier changes must not be forgotten. The
  -- bucket and the fixed window only compute.
  local ok, result = true, nil
  if op == 1 then
    ok, result = pcall(sliding_window, s, key, now, n2, n3, commit, post_paid)
  elseif op == 2 then
    -- cost quotient and remainder, tolerance quotient and remainder, rate
    if keep ~= nil and (s.keep == nil or keep > s.keep) then s.keep = keep end
    result = token_bucket(s, now, n2, n3, n4, n5, unit, commit, post_paid, claim_q, claim_r)
  elseif op == 6 then
    ok, result = pcall(concurrency, s, now, unit, n2, n3, commit)
  else
    result = fixed_window(s, now, n2, n3, commit, post_paid)
  end
  if s.dirty and scratch == nil then
    if not h.wc then
      h.wc, h.wi = call, i
    else
      local w = h.more
      if w == nil then
        w = {}
        h.more = w
      end
      w[#w + 1], w[#w + 2] = call, i
    end
  end
  s.dirty = s.dirty or was_dirty
  if not ok then error(result, 0) end
  if held ~= nil then
    sink_n = sink_n + 1
    sink[sink_n] = held
  end
  return result
end

-- A key whose entry starts at `start` failed with `e`: the numbers written before the error are
-- taken back, the error stands in their place and is recorded in `failed`.
local function entry_failed(start, call, i, e)
  for j = start + 1, sink_n do sink[j] = nil end
  sink_n = start
  sink[start] = error_text(e)
  fail(call, i, e)
end

-- Runs key `i` of call `call` (`run`'s arguments) into the sink: its reply's length, then its
-- numbers; an error leaves the key one string and is recorded in `failed`. Returns whether it
-- passed (nil when it failed) and where its entry starts.
local function entry(at, now, charging, commit_charges, call, i, scratch)
  local start = sink_n + 1
  sink_n = start
  local ok, allowed = pcall(run, at, now, charging, commit_charges, call, i, scratch)
  if ok then
    sink[start] = sink_n - start
    return allowed, start
  end
  entry_failed(start, call, i, allowed)
  return nil, start
end

-- The format of `n` numbers of the packed reply, each length made once and kept (string.rep adds
-- its string once a repetition): constants, right in any later call, at most 256 of them.
local reply_formats = {}
local function reply_format(n)
  local format = reply_formats[n]
  if format == nil then
    format = '>' .. string.rep('i8', n)
    reply_formats[n] = format
  end
  return format
end

-- Zeros, the first places of every reply (check's `out`), made as far as a call needs them and
-- kept: constants, never written but to add more.
local ZERO_LIST_LENGTH = 512
local zero_list = {}

-- One script call: what the header above describes. Everything it keeps is reset here first:
-- as a Redis function (FCALL) the definitions above are made once, when the library is
-- loaded, and live between calls.
local function check(KEYS, ARGV)
  numbers, keys, redis_now, read_numbers = ARGV[1], KEYS, nil, struct.unpack
  held, held_keys = {}, {}
  failed, fatal = {}, nil
  -- claims.lua's holder tables, read at most once a script call and never kept past it.
  claim_tables = {}
  local call_count, carried, a = read_numbers('>i8i8', numbers, 1)
  if carried > 0 then
    keys = {}
    for i = 1, carried do
      keys[i] = ARGV[1 + i]
      local here = redis.pcall('EXISTS', keys[i])
      if type(here) == 'table' and here.err then
        return redis.error_reply('TRYAGAIN portcullis: a key of the batch is not served here: ' ..
          tostring(here.err))
      end
    end
  end

  -- The reply (common.lua's `sink`): the clock's place first. Made as long as the usual reply
  -- (six numbers a call of one check), its places zeros: a table grows its array part only by
  -- moving every number it holds, again at each doubling (a tenth of a cold decision's cost).
  local places = math.min(1 + 6 * call_count, ZERO_LIST_LENGTH)
  for i = #zero_list + 1, places do zero_list[i] = 0 end
  local out = {unpack(zero_list, 1, places)}
  sink, sink_n = out, 1

  local modes = {}
  for call = 1, call_count do
    local now, expires, mode, count = read_numbers(CALL_HEAD, numbers, a)
    -- 4: each alone (0), its one check on a key no other check of the script call names.
    local once = mode == 4
    if once then mode = 0 end
    if now == 0 then now = redis_now or clock(0) end
    a = a + CALL_HEAD_BYTES
    -- (Only a mode other than each alone is kept: the failed keys' reply reads it.)
    if mode ~= 0 then modes[call] = mode end
    sink_n = sink_n + 1
    out[sink_n] = count
    local commit_charges = mode == 0
    local decided = true
    if expires > 0 and now > expires and now - expires < 60000000 then
      fail(call, nil, 'EXPIRED portcullis: the call reached Redis after its deadline; not run')
      decided = false
    end
    -- The cold path's usual call: one charge, each alone, on a key no other check of the script
    -- call names (its place negated): `quick`, without `entry` and `run` around it.
    local op, unit, n2, n3, n4, n5, place = nil, nil, nil, nil, nil, nil, 0
    local prefer_hash = false
    if decided and once then
      op, unit, n2, n3, n4, n5, place = read_numbers(KEY_NUMBERS, numbers, a)
      if HASH_OPS[op] then op, prefer_hash = HASH_OPS[op], true end
    end
    if place < 0 and op >= 1 and op <= 3 then
      local first = sink_n + 1
      sink_n = first
      -- fixed_quick, bucket_quick (either layout), sliding_quick (a string) or
      -- sliding_quick_hash, without a pcall (they return Redis' errors); a key stored in the
      -- other layout or in a state they leave (a sliding window's full form, a refusal with
      -- hits stored) by `quick` (given the sliding window's string or fields when read).
      local ok, allowed, e, raw = true, nil, nil, nil
      if op == 3 then
        allowed, e = fixed_quick(keys[-place], now, unit, n2, n3, prefer_hash)
      elseif op == 2 then
        allowed, e = bucket_quick(keys[-place], now, unit, n2, n3, n4, n5, prefer_hash)
      elseif not prefer_hash then
        allowed, e, raw = sliding_quick(keys[-place], now, unit, n2, n3)
      else
        allowed, e, raw = sliding_quick_hash(keys[-place], now, unit, n2, n3)
      end
      if e ~= nil then ok, allowed = false, e end
      if ok and allowed == nil then
        ok, allowed = pcall(quick, op, keys[-place], now, unit, n2, n3, n4, n5, prefer_hash, raw)
      end
      if ok then
        sink[first] = sink_n - first
      else
        entry_failed(first, call, 1, allowed)
      end
      a = a + KEY_BYTES
    else
      -- An all-or-nothing call's look: each charge's entry in `look`, where it starts in `looks`.
      local look, looks = nil, nil
      if decided and (mode == 1 or mode == 3) then
        -- Look first, on copies: a charge happens only if every charge of the call would pass.
        commit_charges = true
        local scratch = {}
        look, looks = {}, {}
        local out_n = sink_n
        sink, sink_n = look, 0
        for i = 0, count - 1 do
          local op = read_numbers(NUMBER, numbers, a + KEY_BYTES * i)
          if op < 10 or op > 20 then -- not a refund (11-13, 15, 16)
            local at = a + KEY_BYTES * i
            local allowed, start = entry(at, now, true, true, call, i + 1, scratch)
            if allowed == nil then
              -- Undecidable as a whole: nothing of it is charged.
              fail(call, nil, look[start])
              decided = false
              break
            end
            looks[i + 1] = start
            if allowed == 0 then commit_charges = false end
          end
        end
        sink, sink_n = out, out_n
      end
      -- Refunds and post-paid charges apply whatever the call's other charges answer (`run`).
      local charging = mode == 0 or mode == 1
      for i = 0, count - 1 do
        if not decided then
          -- Each key's place, filled with the call's error at the end.
          sink_n = sink_n + 1
          out[sink_n] = 0
        else
          -- A charge the look refused, not to be written (a post-paid one is, as a refund is).
          local at = looks and looks[i + 1]
          if at ~= nil and look[at + 1] == 0 then
            local op = read_numbers(NUMBER, numbers, a + KEY_BYTES * i)
            if charging and (commit_charges or op > 10) then at = nil end
          end
          if at ~= nil and look[at + 1] == 0 then
            -- Refused as a whole: a charge the look refused answers so (the second of two checks
            -- on one key is refused there, not alone); the others answer as a probe would.
            for j = at, at + look[at] do
              sink_n = sink_n + 1
              out[sink_n] = look[j]
            end
          else
            entry(a + KEY_BYTES * i, now, charging, commit_charges, call, i + 1)
          end
        end
      end
      a = a + KEY_BYTES * count
    end
  end
  flush_all()
  if fatal ~= nil then return redis.error_reply(fatal) end
  out[1] = redis_now or 0
  if next(failed) == nil then
    -- Every key decided: the numbers as one binary string (big-endian 64-bit), packed by Redis'
    -- `struct` a few hundred at a time (each goes on Lua's stack): Portcullis reads them without
    -- parsing a RESP integer each.
    -- (`out` may be longer than its numbers: sink_n says where they end.)
    if sink_n <= 256 then return struct.pack(reply_format(sink_n), unpack(out, 1, sink_n)) end
    local parts = {}
    for first = 1, sink_n, 256 do
      local last = math.min(first + 255, sink_n)
      local format = reply_format(last - first + 1)
      parts[#parts + 1] = struct.pack(format, unpack(out, first, last))
    end
    return table.concat(parts)
  end

  -- Some keys failed after they were answered (a write refused), or a whole call did: the reply
  -- is written again with each failed key's error in its place.
  local again, at = {out[1]}, 2
  for call = 1, call_count do
    local f, count = failed[call], out[at]
    again[#again + 1] = count
    at = at + 1
    -- All or nothing: a key that failed leaves the whole call undecided.
    local whole = f and f.all
    if f ~= nil and whole == nil and (modes[call] == 1 or modes[call] == 3) then
      for i = 1, count do whole = whole or f[i] end
    end
    for i = 1, count do
      local size = 0
      if type(out[at]) == 'number' then size = out[at] end
      local e = whole or (f and f[i])
      if e ~= nil then
        again[#again + 1] = error_text(e)
      else
        for j = at, at + size do again[#again + 1] = out[j] end
      end
      at = at + 1 + size
    end
  end
  return again
end
