-- quota: RLQS grants, one gateway's report on each rule named, on Redis' clock. The same
-- transition as algorithm::share::report in Rust (the memory store is its model): expired
-- holders dropped, the gateway's demand recorded, its grant set to its max-min fair share within
-- what the other live holders leave, quantized to what Envoy enforces (rounded down).
-- KEYS: one hash per rule (field: gateway id, value: "demand:granted:expires_us").
-- ARGV: per key capacity, gateway, demand, ttl_us; then the most holders a rule keeps.
-- Reply: per key {tokens per fill, fill seconds}, {0, 0} for nothing.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_holders = tonumber(ARGV[#ARGV])
local eps = 1e-9

local function quantize(rate)
  if rate ~= rate or rate <= 1e-12 then
    return 0, 0
  end
  if rate + eps >= 1 then
    return math.floor(rate + eps), 1
  end
  local every = math.ceil(1 / rate - eps)
  if every > 3600 then
    return 0, 0
  end
  return 1, every
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
  local base = (k - 1) * 4
  local capacity = math.max(tonumber(ARGV[base + 1]), 0)
  local gateway = ARGV[base + 2]
  local demand = math.max(tonumber(ARGV[base + 3]), 0)
  local ttl = tonumber(ARGV[base + 4])
  local all = redis.call('HGETALL', key)
  local demands, granted = {}, {}
  local me = nil
  for j = 1, #all, 2 do
    local d, g, e = string.match(all[j + 1], '^([^:]+):([^:]+):([^:]+)$')
    d, g, e = tonumber(d), tonumber(g), tonumber(e)
    if all[j] == gateway then
      me = #demands + 1
      demands[me], granted[me] = demand, 0
    elseif e ~= nil and e > now then
      demands[#demands + 1], granted[#granted + 1] = d, g
    else
      redis.call('HDEL', key, all[j])
    end
  end
  local per_fill, every = 0, 0
  if me == nil and #demands >= max_holders then
    out[k] = {0, 0}
  else
    if me == nil then
      me = #demands + 1
      demands[me], granted[me] = demand, 0
    end
    local others = 0
    for i = 1, #granted do
      if i ~= me then
        others = others + granted[i]
      end
    end
    per_fill, every = quantize(math.min(fair_share(capacity, demands, me), capacity - others))
    local rate = 0
    if every > 0 then
      rate = per_fill / every
    end
    redis.call('HSET', key, gateway,
      string.format('%.17g:%.17g:%d', demand, rate, now + ttl))
    out[k] = {per_fill, every}
  end
  -- The hash lives as long as its longest grant.
  local longest = 0
  all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do
    local e = tonumber(string.match(all[j + 1], ':(%d+)$'))
    if e ~= nil and e > longest then
      longest = e
    end
  end
  if longest > now then
    redis.call('PEXPIREAT', key, math.floor(longest / 1000) + 1)
  end
end
return out
