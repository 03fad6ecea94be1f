-- concurrency_open(key, now_us) -> state; concurrency(state, now_us, lease_us, slots, hits,
-- commit) -> reply; concurrency_flush(key, state, now_us); concurrency_refund(key, now_us, hits,
-- commit) -> reply
--
-- The state transition of algorithm::concurrency: the leases' ends in microseconds, earliest
-- first, as one string of big-endian 64-bit integers (8 bytes a slot held). Leases that ended
-- are dropped when the key is read. A charge takes `hits` slots, each leased until now +
-- lease_us, if they all fit; a refund releases the leases that end first, never more than are
-- held.
--
-- Replies (common.lua's `reply` and one more number) {allowed (0|1), now_us, held, first end,
-- last end}, the state after the check.
-- TTL: until the last lease ends.
local function concurrency_open(key, now)
  local packed = redis.call('GET', key)
  local ends, n = {}, 0
  if packed then
    for at = 1, #packed - 7, 8 do
      local e = struct.unpack('>i8', packed, at)
      if e > now then
        n = n + 1
        ends[n] = e
      end
    end
  end
  -- The key's TTL is its last lease's end: stored_last says which end it was written with.
  local stored_last = nil
  if n > 0 then stored_last = ends[n] end
  return {ends = ends, n = n, dirty = false, stored_last = stored_last}
end

local function concurrency_reply(allowed, now, s)
  local last = 0
  if s.n > 0 then last = s.ends[s.n] end
  reply(allowed, now, s.n, s.ends[1] or 0)
  sink_n = sink_n + 1
  sink[sink_n] = last
  return allowed
end

local function concurrency(s, now, lease_us, slots, hits, commit)
  if s.n + hits > slots then return concurrency_reply(0, now, s) end
  if hits > 0 and commit then
    local e = now + lease_us
    if s.n > 0 and s.ends[s.n] > e then e = s.ends[s.n] end
    for _ = 1, hits do
      s.n = s.n + 1
      s.ends[s.n] = e
    end
    s.dirty = true
  end
  return concurrency_reply(1, now, s)
end

local function concurrency_flush(key, s, now)
  if not s.dirty then return end
  if s.n == 0 then
    redis.call('DEL', key)
    return
  end
  local parts = {}
  for i = 1, s.n do parts[i] = struct.pack('>i8', s.ends[i]) end
  if s.n > 0 and s.ends[s.n] == s.stored_last then
    -- The last lease is the one the key expires with already (a release): one write.
    redis.call('SET', key, table.concat(parts), 'KEEPTTL')
  else
    redis.call('SET', key, table.concat(parts))
    redis.call('PEXPIREAT', key, expire_at_ms(now, s.ends[s.n] - now))
  end
end

local function concurrency_refund(key, now, hits, commit)
  local s = concurrency_open(key, now)
  -- Not committed (a probe): the state as it is, as the memory store answers.
  local released = 0
  if commit then released = math.min(hits, s.n) end
  if released > 0 then
    local kept = {}
    for i = released + 1, s.n do kept[i - released] = s.ends[i] end
    s.ends, s.n = kept, s.n - released
  end
  -- Written even when nothing was released: leases that ended are dropped (the key deleted
  -- when none is left), as the memory store drops them.
  s.dirty = commit
  concurrency_flush(key, s, now)
  return concurrency_reply(1, now, s)
end
