-- quota_in_use: a replica that serves RLQS says so, for every replica on this Redis to count the
-- grants' claims in its RLS checks (they look every second). KEYS[1]: the flag, its own hash
-- tag; its value: when it was first set (ms, Redis' clock), its TTL: as long as any claim may
-- stand. KEYS[2]: the mark of replicas whose RLS checks cannot count claims (quota_blind.lua),
-- in the same hash tag. ARGV[1]: how long the flag must stand at least from now (ms), ARGV[2]:
-- how long after it was first set every replica has seen it (ms). Never shortens the TTL, never
-- moves the first time (an older replica's flag, "1", reads as set long ago). Returns how long
-- until the flag has been seen by every replica (ms, 0: already): grants wait that long; or,
-- while the mark stands, the mark's text (what those replicas count apart), and sets nothing.
local blind = redis.call('GET', KEYS[2])
if blind then return blind end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = tonumber(redis.call('GET', KEYS[1]) or '')
if first == nil then first = now end
local stand = tonumber(ARGV[1])
local left = redis.call('PTTL', KEYS[1])
if left > stand then stand = left end
redis.call('SET', KEYS[1], first, 'PX', stand)
return math.max(first + tonumber(ARGV[2]) - now, 0)
