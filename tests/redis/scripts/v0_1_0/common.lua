-- Helpers shared by the algorithm functions; loaded first.
--
-- TTLs are set with PEXPIREAT on the script's own clock: in production that clock is Redis TIME,
-- which makes it the same as PEXPIRE; a test that fixes the clock in the future never sees a key
-- expire by wall time in the middle of a replayed sequence.
local function expire_at_ms(now, ttl_us)
  return string.format('%.0f', math.ceil((now + math.max(ttl_us, 1000)) / 1000))
end


-- One key's reply: its numbers separated by spaces (check.lua joins a call's keys with ',' and the
-- calls with ';'). One string for the whole script call instead of nested arrays: the service
-- parses it without building a reply tree. '%d' prints every number exactly (all are integers
-- below 2^53; Lua's own number-to-string conversion keeps 14 digits, too few for a clock in us).
local function reply(allowed, now, a, b)
  return string.format('%d %d %d %d', allowed, now, a, b)
end
