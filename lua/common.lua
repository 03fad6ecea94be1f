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

-- The expiry, as PEXPIREAT and PXAT take it (digits).
local function expire_at_ms(now, ttl_us)
  return int(math.ceil((now + math.max(ttl_us, 1000)) / 1000))
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
