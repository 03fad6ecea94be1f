-- Helpers shared by the algorithm functions; loaded first.
--
-- TTLs are set with PEXPIREAT on the script's own clock: in production that clock is Redis TIME,
-- which makes it the same as PEXPIRE; a test that fixes the clock in the future never sees a key
-- expire by wall time in the middle of a replayed sequence.
local function expire_at_ms(now, ttl_us)
  return string.format('%.0f', math.ceil((now + math.max(ttl_us, 1000)) / 1000))
end

