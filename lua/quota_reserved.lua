-- quota_reserved: one page of the reservation index's live entries, read with HSCAN so that no
-- call holds Redis long whatever the index's size (a whole read of 100,000 entries took 150-310
-- ms, past every RLS call queued behind it); entries past their end are dropped (on Redis'
-- clock). KEYS[1]: the index. ARGV: the cursor ("0" to start), how many entries to look at.
-- Reply: {next cursor ("0": done), tag, held, tag, held, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local all = page[2]
local out = {page[1]}
for i = 1, #all, 2 do
  local held, ends = string.match(all[i + 1], '^([^|]+)|(%d+)|')
  if ends ~= nil and tonumber(ends) > now then
    out[#out + 1] = all[i]
    out[#out + 1] = held
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
