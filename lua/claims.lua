-- claims: the RLQS holder table `{tag}:q` read back, and what a holder's grant claims of a
-- rule's window (the same operations, in the same order, as algorithm::claims and
-- algorithm::share::Holder, so that Redis and the memory store agree). Shared by quota.lua
-- (which writes the table) and check.lua (whose RLS checks count the claims). It must never
-- claim less than a gateway at its rate can admit inside the window.

-- A holder record, "demand:granted:expires_us:since_us:claim_rate:keep_until_us", as a table;
-- nil when unreadable. A record of an older replica ("demand:granted:expires_us") is claimed at
-- its rate over the 11 s before its end (its time to live at Envoy's 5 s reports) and kept to
-- its end.
local function holder(value)
  local d, g, e, s, c, k = string.match(value,
    '^([^:]+):([^:]+):([^:]+):([^:]+):([^:]+):([^:]+)$')
  if d == nil then
    d, g, e = string.match(value, '^([^:]+):([^:]+):([^:]+)$')
    e = tonumber(e)
    if e == nil then return nil end
    s, c, k = e - 11000000, g, e
  end
  local h = {demand = tonumber(d), granted = tonumber(g), expires = tonumber(e),
    since = tonumber(s), claim_rate = tonumber(c), keep = tonumber(k)}
  if h.demand == nil or h.granted == nil or h.expires == nil or h.since == nil
    or h.claim_rate == nil or h.keep == nil then
    return nil
  end
  return h
end

local function overlap(a0, a1, b0, b1)
  return math.max(math.min(a1, b1) - math.max(a0, b0), 0)
end

-- algorithm::claims::claim: requests holder `h` may admit that a check of `algorithm` (1
-- sliding, 2 bucket, 3 fixed) over `window` us at `now` must count.
local function claim_of(h, algorithm, window, now)
  if not (h.claim_rate > 0) or h.expires <= h.since or window <= 0 then return 0 end
  local us = 0
  if algorithm == 3 then
    local start = now - math.fmod(now, window)
    us = overlap(h.since, h.expires, start, start + window)
  elseif algorithm == 1 then
    us = math.min(overlap(h.since, h.expires, math.max(now - window, 0), now + window), window)
  elseif algorithm == 2 then
    us = overlap(h.since, h.expires, 0, now)
  end
  return h.claim_rate * us / 1e6
end

-- The holder table of `key`'s descriptor: the key up to its tag's `}`, plus ':q'.
local function table_of(key)
  local tag = string.match(key, '^(.*})')
  if tag == nil then return nil end
  return tag .. ':q'
end

-- Each holder table read in this script call: its gateways' records (holders claiming
-- something), or false when none does.
local claim_tables = {}

-- Reads `key`'s holder table into `claim_tables` (once). The table is not declared (it shares
-- its counter's slot, and most descriptors have none): while that slot migrates on Cluster,
-- Redis refuses a table this node does not hold, one that never existed as one that moved. It
-- is then read as empty: during a migration, a held descriptor's RLS checks may miss the claims
-- (docs/redis.md), rather than every check of the slot failing.
local function read_claims(key)
  local table_key = table_of(key)
  if table_key == nil or claim_tables[table_key] ~= nil then return end
  local values = redis.pcall('HVALS', table_key)
  if type(values) == 'table' and values.err then
    -- Any other refusal (an ACL without HVALS) fails the key, never passes silently.
    if not string.find(tostring(values.err), 'non local key', 1, true) then
      error(values)
    end
    values = {}
  end
  local list = false
  for i = 1, #values do
    local h = holder(values[i])
    if h ~= nil and h.claim_rate > 0 then
      if list == false then list = {} end
      list[#list + 1] = h
    end
  end
  claim_tables[table_key] = list
end

-- The gateways' claims on `key`'s descriptor still kept at `now`: a list of holders, or false
-- when no gateway holds any.
local function claims_on(key, now)
  local table_key = table_of(key)
  if table_key == nil then return false end
  if claim_tables[table_key] == nil then read_claims(key) end
  local list = claim_tables[table_key]
  if not list then return false end
  local kept = false
  for i = 1, #list do
    if list[i].keep > now then
      if kept == false then kept = {} end
      kept[#kept + 1] = list[i]
    end
  end
  return kept
end

-- algorithm::claims::claimed: every claim of `list`, in whole requests (rounded up).
local function claimed_of(list, algorithm, window, now)
  local total = 0
  for i = 1, #list do total = total + claim_of(list[i], algorithm, window, now) end
  return math.max(math.ceil(total - 1e-9), 0)
end
