-- A write's confirmation step, sent once the write returned: announces the
-- write to every near cache and lists who may still hold the old value.
-- KEYS[1]: the prefix's lease registry (see lease.lua)
-- KEYS[2]: the registry of versions before 0.4, read too while it exists
--          (KEYS[1] itself when an ACL refused KEYS[1]'s name)
-- KEYS[3]: (on a single server) the marker key: written and deleted, so that
--          its name, which ends with the marker, follows the write's own
--          invalidation to every holder
-- ARGV[1]: the marker channel ('' to publish no marker)
-- ARGV[2]: the marker: the writer's id and the write's sequence number
-- Returns {now, since, holder, lease end, holder, lease end, ...}, times in
-- the server's milliseconds; a holder may be listed twice, since the later
-- of the two registries' creations.
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
if KEYS[3] then
  redis.call('SET', KEYS[3], '1')
  redis.call('DEL', KEYS[3])
end
local out = {now, 0}
local leased = false -- a lease runs in KEYS[1], whose renewals keep it
local seen = false -- KEYS[1] says the registry of earlier versions was seen
local function list(registry)
  local all = redis.call('HGETALL', registry)
  for i = 1, #all, 2 do
    if all[i] == '~since' then
      out[2] = math.max(out[2], tonumber(all[i + 1]))
    elseif all[i] == '~legacy' then
      seen = seen or registry == KEYS[1]
    elseif registry == KEYS[1] and tonumber(all[i + 1]) < now - 60000 then
      -- A holder gone a minute (it died without Close): forgotten, so that
      -- the registry stays as small as the number of live processes.
      redis.call('HDEL', registry, all[i])
    else
      out[#out + 1] = all[i]
      out[#out + 1] = tonumber(all[i + 1])
      leased = leased or (registry == KEYS[1] and tonumber(all[i + 1]) > now)
    end
  end
end
list(KEYS[1])
-- The registry of earlier versions is read while it exists. Its loss while
-- leases run there (an eviction, say) is noticed as this one's is:
-- "~legacy" says it was seen, and a write that finds it gone starts the
-- wait of a new registry.
if KEYS[2] ~= KEYS[1] then
  if redis.call('EXISTS', KEYS[2]) == 1 then
    if not seen then
      redis.call('HSET', KEYS[1], '~legacy', now)
    end
    list(KEYS[2])
  elseif seen then
    redis.call('HDEL', KEYS[1], '~legacy')
    redis.call('HSET', KEYS[1], '~since', now)
    out[2] = now
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
