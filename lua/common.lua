-- Helpers shared by the algorithm functions; loaded first.
--
-- TTLs are set with PEXPIREAT (or SET's PXAT) on the script's own clock: in production that
-- clock is Redis TIME, which makes it the same as PEXPIRE; a test that fixes the clock in the
-- future never sees a key expire by wall time in the middle of a replayed sequence.
--
-- Numbers go to redis.call through `int`: as they are where Redis prints an integral number as
-- its digits (7.2 and later; Valkey says 7.2.4), else as string.format('%d') digits (every number
-- written is an integer below 2^53, exact as a C long): Redis 7.0 and 6 print a Lua number with
-- snprintf's '%.17g', printf's floating-point path, a ninth of a new key's whole cost; '%d' costs
-- a third of that, more than the number itself where that is cheap (callgrind: Redis 7.0 5%
-- fewer instructions a decision with '%d', Valkey 9 10% more).
local int = nil
if (redis.REDIS_VERSION_NUM or 0) >= 0x070200 then
  int = function(n) return n end
else
  int = function(n) return string.format('%d', n) end
end

-- SET's NX with GET: Redis 7.0 and later (Valkey says 7.2.4); older servers read first.
local MAKE_WITH_GET = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

-- The expiry, as PEXPIREAT and PXAT take it (digits). The last one made is kept: the new keys of
-- one rule in a script call share their expiry (a fixed window's end, a new bucket's span), so
-- one is printed, not one a key. A memo of a pure function, right in any later call too.
local expiry_ms, expiry_digits = nil, nil
local function expire_at_ms(now, ttl_us)
  local ms = math.ceil((now + math.max(ttl_us, 1000)) / 1000)
  if ms ~= expiry_ms then expiry_ms, expiry_digits = ms, int(ms) end
  return expiry_digits
end


-- Where replies go: check.lua points `sink` at the script's reply (a flat array of integers,
-- sent as one binary string: making a decimal string per key was a fifth of the script's cost
-- per check) or at an all-or-nothing call's look, and `sink_n` is its length. A key's reply is
-- its numbers, as each algorithm function documents: reply(allowed, now, a, b) and, for a
-- refusal's live sub-windows, reply_pair(index, count). Every number is an integer below 2^53.
local sink, sink_n = {}, 0
local function reply(allowed, now, a, b)
  local n = sink_n
  sink[n + 1], sink[n + 2], sink[n + 3], sink[n + 4] = allowed, now, a, b
  sink_n = n + 4
  return allowed
end

local function reply_pair(index, count)
  local n = sink_n
  sink[n + 1], sink[n + 2] = index, count
  sink_n = n + 2
end

-- Counters come in two layouts: a string (the sliding window's packed form, the fixed window's
-- and the bucket's numbers; each written with its expiry by one SET) and 0.1.0's hash, which
-- 0.1.0 replicas read. A key is read as it is stored; a new one is made in the layout its call
-- prefers (`--redis-layout`).
--
-- The string `key` holds; false when it does not exist; nil and true for a hash (Redis answers
-- GET WRONGTYPE). Any other error raises.
local function stored_string(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    if string.find(raw.err, 'WRONGTYPE', 1, true) then return nil, true end
    error(raw)
  end
  return raw, false
end

-- A string of the length a layout never has: not a counter (another program shares the prefix).
local NOT_A_COUNTER = {err = 'WRONGTYPE portcullis: the key holds a string that is not a counter'}
local function not_a_counter()
  error(NOT_A_COUNTER)
end


-- The operations whose new keys are made as hashes (0.1.0's layout: 5, 7, 8 and their refunds
-- and post-paid charges), each to the operation it is: 1 sliding, 2 bucket, 3 fixed.
local HASH_OPS = {[5] = 1, [15] = 11, [25] = 21, [7] = 2, [17] = 12, [27] = 22, [8] = 3,
  [18] = 13, [28] = 23}
