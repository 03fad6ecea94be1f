-- concurrency_open(key, now_us) -> state; concurrency(state, now_us, lease_us, slots, hits,
-- commit) -> reply; concurrency_flush(key, state, now_us); concurrency_refund(key, now_us, hits,
-- commit) -> reply
--
-- The state transition of algorithm::concurrency: the leases' ends in microseconds, earliest
-- first, as one string of big-endian 64-bit integers (8 bytes a slot held). Leases that ended
-- are dropped when the key is read. A charge takes `hits` slots, each leased until now +
-- lease_us, if they all fit, ending on a whole millisecond at least one after the latest end
-- (algorithm::concurrency::lease_end: the end names the take, lease_token); a release of a token
-- (hits above 1000) frees the leases whose end it names, else of a count the leases that end
-- first, never more than are held.
--
-- Replies (common.lua's `reply` and two more numbers) {allowed (0|1), now_us, held, first end,
-- last end, took}, the state after the check; took is 1 when this check took slots (they end
-- last: their end names them), else 0.
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

local function concurrency_reply(allowed, now, s, took)
  local last = 0
  if s.n > 0 then last = s.ends[s.n] end
  reply(allowed, now, s.n, s.ends[1] or 0)
  sink[sink_n + 1] = last
  sink[sink_n + 2] = took
  sink_n = sink_n + 2
  return allowed
end

local function concurrency(s, now, lease_us, slots, hits, commit)
  if s.n + hits > slots then return concurrency_reply(0, now, s, 0) end
  local took = 0
  if hits > 0 and commit then
    -- In milliseconds: the lease rounded up, at least one after the latest end held.
    local e = math.floor((now + lease_us + 999) / 1000)
    if s.n > 0 then e = math.max(e, math.floor(s.ends[s.n] / 1000) + 1) end
    e = e * 1000
    for _ = 1, hits do
      s.n = s.n + 1
      s.ends[s.n] = e
    end
    s.dirty = true
    took = 1
  end
  return concurrency_reply(1, now, s, took)
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
    redis.call('SET', key, table.concat(parts), 'PXAT', expire_at_ms(now, s.ends[s.n] - now))
  end
end

local function concurrency_refund(key, now, hits, commit)
  local s = concurrency_open(key, now)
  -- Not committed (a probe): the state as it is, as the memory store answers.
  local released = 0
  if commit and hits > 1000 then
    -- A lease token: algorithm::concurrency::lease_token of each end, the leases it names freed.
    local kept, k = {}, 0
    for i = 1, s.n do
      if 1001 + math.floor(s.ends[i] / 1000) % 999999000 ~= hits then
        k = k + 1
        kept[k] = s.ends[i]
      end
    end
    s.ends, s.n = kept, k
  elseif commit then
    released = math.min(hits, s.n)
  end
  if released > 0 then
    local kept = {}
    for i = released + 1, s.n do kept[i - released] = s.ends[i] end
    s.ends, s.n = kept, s.n - released
  end
  -- Written even when nothing was released: leases that ended are dropped (the key deleted
  -- when none is left), as the memory store drops them.
  s.dirty = commit
  concurrency_flush(key, s, now)
  return concurrency_reply(1, now, s, 0)
end
