-- Helpers shared by the algorithm functions; loaded first.
--
-- TTLs are set with PEXPIREAT (or SET's PXAT) on the script's own clock: in production that
-- clock is Redis TIME, which makes it the same as PEXPIRE; a test that fixes the clock in the
-- future never sees a key expire by wall time in the middle of a replayed sequence.
--
-- Numbers go to redis.call as their digits, made by `int` (string.format's '%d': every number
-- written is an integer below 2^53, exact as a C long). Not as Lua numbers, which Redis 7.0
-- formats with snprintf's '%.17g', nor by '%.0f': either runs printf's floating-point path, a
-- ninth of a new key's whole cost (callgrind, three numbers a key).
local function int(n)
  return string.format('%d', n)
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
