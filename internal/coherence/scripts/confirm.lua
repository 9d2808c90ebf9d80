-- A write's confirmation step, sent once the write returned: announces the
-- write to every near cache and lists who may still hold the old value.
-- KEYS[1]: the prefix's lease registry (see lease.lua)
-- KEYS[2]: (on a single server) the marker key: written and deleted, so that
--          its name, which ends with the marker, follows the write's own
--          invalidation to every holder
-- ARGV[1]: the marker channel ('' to publish no marker)
-- ARGV[2]: the marker: the writer's id and the write's sequence number
-- Returns {now, since, holder, lease end, holder, lease end, ...}, times in
-- the server's milliseconds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A registry created now (first use, or lost: flushed, evicted, a restart)
-- may have forgotten leases still running: the writer waits out one lease
-- from "~since".
-- (HSETNX only when missing: a write command fails under maxmemory, even
-- one that would change nothing.)
if redis.call('HEXISTS', KEYS[1], '~since') == 0 then
  redis.call('HSETNX', KEYS[1], '~since', now)
end
if ARGV[1] ~= '' then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
if KEYS[2] then
  redis.call('SET', KEYS[2], '1')
  redis.call('DEL', KEYS[2])
end
local out = {now, now}
local leased = false
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] == '~since' then
    out[2] = tonumber(all[i + 1])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = tonumber(all[i + 1])
    leased = leased or tonumber(all[i + 1]) > now
  end
end
-- While leases run, the holders' renewals keep the registry (three leases
-- past the last, lease.lua). Without them it is kept ten minutes past the
-- last write: a registry that expired between the writes of writers
-- without near caches would make the next write wait out one lease, as
-- for a lost one. (PEXPIRE is allowed under maxmemory.)
if not leased then
  redis.call('PEXPIRE', KEYS[1], 600000)
end
return out
