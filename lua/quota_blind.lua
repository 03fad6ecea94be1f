-- quota_blind: a replica whose RLS checks cannot count the RLQS grants' claims (it counts some
-- limits where no claim is, as a per-second Redis) marks this Redis, so that no replica serves
-- RLQS on it meanwhile (quota_in_use.lua refuses while the mark stands), unless one already
-- does. KEYS[1]: the RLQS flag, KEYS[2]: the mark, in one hash tag (one atomic step: of two
-- replicas starting at once, one of each kind, exactly one is refused). ARGV[1]: how long the
-- mark stands (ms); ARGV[2]: what this replica counts apart (the setting, for the refused to
-- name). Returns -2 when marked; else the flag's PTTL (ms, -1 for none): RLQS is served here,
-- and nothing was set.
local left = redis.call('PTTL', KEYS[1])
if left ~= -2 then return left end
redis.call('SET', KEYS[2], ARGV[2], 'PX', tonumber(ARGV[1]))
return -2
