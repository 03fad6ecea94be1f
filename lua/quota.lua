-- quota: RLQS grants, one gateway's report on each rule named, on Redis' clock. The same
-- transition as algorithm::share::report in Rust (the memory store is its model): expired
-- holders dropped, the gateway's demand recorded, its grant set to its max-min fair share within
-- what the other live holders leave, quantized to what Envoy enforces (rounded down).
-- KEYS: one hash per rule, `{tag}:q` (field: gateway id, value:
-- "demand:granted:expires_us:since_us:claim_rate:keep_until_us", algorithm::share::Holder; the
-- check script reads the same table for the grants' claims, claims.lua; a gateway that reserves
-- its part, or whose claim holds a reservation past what it was granted, also has field
-- 'v' .. id, "reserved_since_us (0: no longer reserving):granted_rate", algorithm::share's
-- reserved_since_us and granted_rate, which the check script and older replicas do not read:
-- its claim_rate already holds the reservation).
-- ARGV: per key capacity, gateway, demand, ttl_us, kind (0 a report; 1 RLS calls' demand,
-- recorded with no grant, as algorithm::share::record_demand; 2 its stream ended: its share
-- freed, its claim kept to its grant's end, as algorithm::share::stream_ended; 3 its ended claim
-- is in the counters: its record goes, as algorithm::share::forget), charged (1: the gateway's admissions up to now are in
-- the rule's counters, its claim starts again), the rule's longest window (us), what its
-- windows have left (algorithm::share::Room: per window
-- "operation:window:left:charged:span:limit:sub-window:counter", left signed, joined by ';';
-- `counter` the place of the window's counter key among those below, from 1, or 0: the room
-- stands as given); then the rooms' counter keys (each in its ask's slot: it shares the
-- descriptor's hash tag), read in this call (read_room); then the clock (0: Redis TIME; a fixed
-- reading in us only in tests), then the most holders a rule keeps.
-- Reply: {now_us, per key {tokens per fill, fill seconds, 1 when the gateway is short of its
-- fair share (others hold it: the replica marks the descriptor contested) else 0}}; {0, 0, ...}
-- for no grant.
-- Appended to common.lua, the sliding and fixed windows' files (a room's count, read as a check
-- would) and claims.lua (`holder`).
-- The clock: Redis TIME (0; production always), or a fixed reading in us for tests.
local now = tonumber(ARGV[#ARGV - 1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max_holders = tonumber(ARGV[#ARGV])
local eps = 1e-9
-- The rooms' counter keys follow the asks' arguments (8 each): counter i is
-- ARGV[counters_at + i].
local counters_at = #KEYS * 8

-- algorithm::share::quantize: the largest rate of at most `rate` among one token every k s (up
-- to a day) and n tokens every 1, 10 or 60 s; of equal rates the first found.
local function quantize(rate)
  if rate ~= rate or rate <= 1e-12 then
    return 0, 0
  end
  local best_fill, best_every, best_rate = 0, 0, -1
  local function consider(fill, every)
    if fill > 0 and fill / every > best_rate then
      best_fill, best_every, best_rate = fill, every, fill / every
    end
  end
  if rate < 1 then
    local every = math.ceil(1 / rate - eps)
    if every <= 86400 then
      consider(1, every)
    end
  end
  for _, every in ipairs({1, 10, 60}) do
    consider(math.min(math.floor(rate * every + eps), 4294967295), every)
  end
  return best_fill, best_every
end

local function fair_share(capacity, demands, me)
  local n = #demands
  local order = {}
  for i = 1, n do
    order[i] = i
  end
  table.sort(order, function(a, b)
    if demands[a] == demands[b] then
      return a < b
    end
    return demands[a] < demands[b]
  end)
  local left = capacity
  local mine = 0
  for done = 0, n - 1 do
    local i = order[done + 1]
    local equal = left / (n - done)
    local take = math.min(math.max(demands[i], 0), equal)
    if i == me then
      mine = take
    end
    left = left - take
  end
  if left > 0 then
    mine = mine + left / n
  end
  return mine
end

-- algorithm::share::sliding_room: the most per second a sliding window holds for `mine`'s
-- new grant over `span`: the window's left less the others' claims (never less than what
-- remains of its own claim, a reservation as its own only once it has stood the whole window),
-- plus its charge in so far as the charged hits (admitted before now at most at its granted
-- rate) have left the window by the span's end; while every one may still be in it, what is
-- left without them.
local function sliding_room(mine, claimants, op, window, left, charged, span)
  span = math.min(math.max(span, 1), math.max(window, 1))
  local own, granted_rate = 0, 0
  if mine ~= nil then
    granted_rate = mine.granted_rate
    local rate = mine.claim_rate
    if mine.reserved_since > 0 and now - mine.reserved_since < window then
      rate = mine.granted_rate
    end
    -- What remains of it: its claim less what the gateway admitted on it (the charge).
    own = math.max(claim_of({claim_rate = rate, since = mine.since, expires = mine.expires},
      op, window, now) - charged, 0)
  end
  local base = math.max(left - claimed_of(claimants, op, window, now), own)
  local staying = math.min(charged, granted_rate * math.max(window - span, 0) / 1e6)
  local most = (base + charged - staying) / (span / 1e6)
  if granted_rate > 0 then
    -- Until then every charged hit may still be in the window.
    local all_in = window - charged / granted_rate * 1e6
    if all_in > 0 and all_in < span then most = math.min(most, base / (all_in / 1e6)) end
  end
  return math.max(most, 0)
end

-- A room's window read in this script call, from its counter key (`counter`: its place among
-- the counter keys, 0 for none): its limit less its count, signed, and for a fixed window the
-- part of a grant of `ttl` it holds, on this script's clock (sliding_window.lua and
-- fixed_window.lua read it as a check would, nothing written). What RLS counted and what other
-- reports charged since the room was read before the script call is in it: one step, as the
-- memory store's grant. A key that cannot be read (another type) leaves the room as given.
local function read_room(op, left, span, limit, sub, counter, ttl)
  if counter == 0 then return left, span end
  local key = ARGV[counters_at + counter]
  local ok, count, ends_in = pcall(function()
    if op == 1 then return sliding_open(key, now, sub, false).total, nil end
    local s = fixed_open(key, now, sub)
    return s.count, (s.window + 1) * sub - now
  end)
  if not ok then return left, span end
  if ends_in ~= nil then span = math.min(ttl, ends_in, sub) end
  return limit - count, span
end

-- algorithm::share::most: the most `mine` (its record, or nil) may be granted per second
-- within `rooms`, over the part of the grant each window holds: a fixed window's left (its
-- limit less its count, signed) less what `claimants` (every other holder kept) claim there; a
-- sliding window's sliding_room.
local function most(mine, claimants, rooms, ttl)
  local best = math.huge
  for op, window, left, charged, span, limit, sub, counter in
      string.gmatch(rooms, '(%d+):(%d+):(%-?%d+):(%d+):(%d+):(%d+):(%d+):(%d+)') do
    op, window, left, charged, span = tonumber(op), tonumber(window), tonumber(left),
      tonumber(charged), tonumber(span)
    left, span = read_room(op, left, span, tonumber(limit), tonumber(sub), tonumber(counter), ttl)
    local seconds = math.max(span, 1) / 1e6
    if op == 1 then
      best = math.min(best, sliding_room(mine, claimants, op, window, left, charged, span))
    else
      best = math.min(best, math.max(left - claimed_of(claimants, op, window, now), 0) / seconds)
    end
  end
  return best
end

local function record(demand, granted, expires, since, claim_rate, keep)
  return string.format('%.17g:%.17g:%d:%d:%.17g:%d', demand, granted, expires, since, claim_rate,
    keep)
end

local out = {}
for k, key in ipairs(KEYS) do
  local base = (k - 1) * 8
  local capacity = math.max(tonumber(ARGV[base + 1]), 0)
  local gateway = ARGV[base + 2]
  local demand = math.max(tonumber(ARGV[base + 3]), 0)
  local ttl = tonumber(ARGV[base + 4])
  local kind = ARGV[base + 5]
  local charged = ARGV[base + 6] == '1'
  local window = tonumber(ARGV[base + 7])
  local rooms = ARGV[base + 8]
  local all = redis.call('HGETALL', key)
  local demands, granted = {}, {}
  local me, mine = nil, nil
  -- Reservations ('v' .. id), read with their holders.
  local reserved = {}
  for j = 1, #all, 2 do
    if string.sub(all[j], 1, 1) == 'v' then reserved[string.sub(all[j], 2)] = all[j + 1] end
  end
  -- The replicas' RLS demands (fields 'r…') weigh as one holder asking for their sum
  -- (algorithm::share::Holder::rls). Holders whose grant ended stay for their claims only.
  local rls, kept = nil, 0
  -- Every other holder kept: their claims come off the rooms (algorithm::share::most).
  local claimants = {}
  for j = 1, #all, 2 do
    local h = holder(all[j + 1])
    if string.sub(all[j], 1, 1) == 'v' then
      -- A reservation whose holder is gone goes with it.
      if redis.call('HEXISTS', key, string.sub(all[j], 2)) == 0 then
        redis.call('HDEL', key, all[j])
      end
    elseif all[j] == gateway then
      me, mine = #demands + 1, h
      demands[me], granted[me] = demand, 0
    elseif h ~= nil and h.keep > now then
      kept = kept + 1
      if string.sub(all[j], 1, 1) ~= 'r' then claimants[#claimants + 1] = h end
      if h.expires > now then
        if string.sub(all[j], 1, 1) == 'r' then
          rls = (rls or 0) + math.max(h.demand, 0)
        else
          demands[#demands + 1], granted[#granted + 1] = h.demand, h.granted
        end
      end
    else
      redis.call('HDEL', key, all[j], 'v' .. all[j])
    end
  end
  -- Its own reservation (none: what it claims was granted).
  if mine ~= nil then
    mine.reserved_since, mine.granted_rate = 0, mine.claim_rate
    local r = reserved[gateway]
    if r ~= nil then
      local since, rate = string.match(r, '^([^:]+):([^:]+)$')
      since, rate = tonumber(since), tonumber(rate)
      if since ~= nil and rate ~= nil then mine.reserved_since, mine.granted_rate = since, rate end
    end
  end
  local per_fill, every, short = 0, 0, 0
  if kind == '3' then
    -- algorithm::share::forget: an ended holder whose last grant has ended goes (its claim is in
    -- the rule's counters now).
    if mine ~= nil and mine.granted == 0 and mine.demand == 0 and mine.expires <= now then
      redis.call('HDEL', key, gateway, 'v' .. gateway)
    end
  elseif kind == '2' then
    -- algorithm::share::stream_ended: its share free now (no demand, no grant), its claim kept
    -- until its last assignment ends (Envoy admits on it until then) and a window after.
    if mine ~= nil then
      -- A reservation was never granted: nothing was admitted on it.
      local claim_rate = mine.granted_rate
      redis.call('HDEL', key, 'v' .. gateway)
      if claim_rate > 0 and mine.expires > mine.since and mine.keep > now then
        redis.call('HSET', key, gateway,
          record(0, 0, mine.expires, mine.since, claim_rate, mine.keep))
      else
        redis.call('HDEL', key, gateway)
      end
    end
  elseif me == nil and kept >= max_holders then
    per_fill, every = 0, 0
  elseif kind == '1' then
    redis.call('HSET', key, gateway, record(demand, 0, now + ttl, now, 0, now + ttl))
  else
    if me == nil then
      me = #demands + 1
      demands[me], granted[me] = demand, 0
    end
    if rls ~= nil then
      demands[#demands + 1], granted[#granted + 1] = rls, 0
    end
    local others = 0
    for i = 1, #granted do
      if i ~= me then
        others = others + granted[i]
      end
    end
    local fair = fair_share(capacity, demands, me)
    local part = math.min(fair, capacity - others)
    per_fill, every = quantize(math.min(part, most(mine, claimants, rooms, ttl)))
    -- Short: the others hold what its fair share needs (algorithm::share::is_short).
    if fair > capacity - others + eps then short = 1 end
    local rate = 0
    if every > 0 then
      rate = per_fill / every
    end
    -- Its part as Envoy could enforce it: reserved when the windows cannot hold it yet.
    local reserve_fill, reserve_every = quantize(part)
    local reserve = 0
    if reserve_every > 0 then reserve = reserve_fill / reserve_every end
    local reserving = reserve > rate + eps
    -- Its claim starts again once its admissions are charged; else it keeps its start at the
    -- highest rate granted (or reserved) since.
    local since, claim_rate, granted_rate = now, rate, rate
    if mine ~= nil and not charged and mine.claim_rate > 0 then
      since, claim_rate = mine.since, math.max(mine.claim_rate, rate)
      granted_rate = math.max(mine.granted_rate, rate)
    end
    local from = 0
    if reserving then
      claim_rate = math.max(claim_rate, reserve)
      from = now
      if mine ~= nil and mine.reserved_since > 0 then from = mine.reserved_since end
      -- Contested, as a short gateway is: re-asked soon (algorithm::share::is_reserving).
      short = 1
    end
    -- Kept while it reserves, or while its claim holds a reservation past what was granted.
    if from > 0 or granted_rate < claim_rate then
      redis.call('HSET', key, 'v' .. gateway, string.format('%d:%.17g', from, granted_rate))
    else
      redis.call('HDEL', key, 'v' .. gateway)
    end
    redis.call('HSET', key, gateway,
      record(demand, rate, now + ttl, since, claim_rate, now + ttl + window))
  end
  -- The hash lives as long as its longest keep.
  local longest = 0
  all = redis.call('HVALS', key)
  for j = 1, #all do
    local h = holder(all[j])
    if h ~= nil and h.keep > longest then longest = h.keep end
  end
  if longest > now then
    redis.call('PEXPIREAT', key, math.floor(longest / 1000) + 1)
  else
    redis.call('DEL', key)
  end
  out[k] = {per_fill, every, short}
end
return {now, out}
