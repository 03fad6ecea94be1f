-- quota: RLQS grants, one gateway's report on each rule named, on Redis' clock. The same
-- transition as algorithm::share::report in Rust (the memory store is its model): expired
-- holders dropped, the gateway's demand recorded, its grant set to its max-min fair share within
-- what the other live holders leave, quantized to what Envoy enforces (rounded down).
-- KEYS: one hash per rule (field: gateway id, value: "demand:granted:expires_us").
-- ARGV: per key capacity, gateway, demand, ttl_us, kind (0 a report; 1 RLS calls' demand,
-- recorded with no grant, as algorithm::share::record_demand; 2 the holder taken off, its stream
-- ended, as algorithm::share::release); then the most holders a rule keeps.
-- Reply: {now_us, per key {tokens per fill, fill seconds, what the live grants hold per second
-- (a string), when the longest ends (us), 1 when the gateway is short of its fair share (others
-- hold it: the replica marks the descriptor contested) else 0}}; {0, 0, ...} for no grant. The replica writes the
-- holds into the reservation index (quota_index.lua) for every replica's RLS path.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_holders = tonumber(ARGV[#ARGV])
local eps = 1e-9

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

local out = {}
for k, key in ipairs(KEYS) do
  local base = (k - 1) * 5
  local capacity = math.max(tonumber(ARGV[base + 1]), 0)
  local gateway = ARGV[base + 2]
  local demand = math.max(tonumber(ARGV[base + 3]), 0)
  local ttl = tonumber(ARGV[base + 4])
  local kind = ARGV[base + 5]
  local demand_only = kind == '1'
  local all = redis.call('HGETALL', key)
  local demands, granted = {}, {}
  local me = nil
  -- The replicas' RLS demands (fields 'r…') weigh as one holder asking for their sum
  -- (algorithm::share::Holder::rls).
  local rls, rls_count = nil, 0
  for j = 1, #all, 2 do
    local d, g, e = string.match(all[j + 1], '^([^:]+):([^:]+):([^:]+)$')
    d, g, e = tonumber(d), tonumber(g), tonumber(e)
    if all[j] == gateway then
      me = #demands + 1
      demands[me], granted[me] = demand, 0
    elseif e ~= nil and e > now then
      if string.sub(all[j], 1, 1) == 'r' then
        rls, rls_count = (rls or 0) + math.max(d, 0), rls_count + 1
      else
        demands[#demands + 1], granted[#granted + 1] = d, g
      end
    else
      redis.call('HDEL', key, all[j])
    end
  end
  local per_fill, every, short = 0, 0, 0
  if kind == '2' then
    if me ~= nil then redis.call('HDEL', key, gateway) end
  elseif me == nil and #demands + rls_count >= max_holders then
    per_fill, every = 0, 0
  elseif demand_only then
    redis.call('HSET', key, gateway, string.format('%.17g:0:%d', demand, now + ttl))
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
    per_fill, every = quantize(math.min(fair, capacity - others))
    -- Short: the others hold what its fair share needs (algorithm::share::is_short).
    if fair > capacity - others + eps then short = 1 end
    local rate = 0
    if every > 0 then
      rate = per_fill / every
    end
    redis.call('HSET', key, gateway,
      string.format('%.17g:%.17g:%d', demand, rate, now + ttl))
  end
  -- The hash lives as long as its longest grant; what the live grants hold is the reservation.
  local longest, held = 0, 0
  all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do
    local g, e = string.match(all[j + 1], ':([^:]+):(%d+)$')
    g, e = tonumber(g), tonumber(e)
    if e ~= nil and e > now then
      held = held + (g or 0)
      if e > longest then
        longest = e
      end
    end
  end
  if longest > now then
    redis.call('PEXPIREAT', key, math.floor(longest / 1000) + 1)
  end
  out[k] = {per_fill, every, string.format('%.17g', held), longest, short}
end
return {now, out}
