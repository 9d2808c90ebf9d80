-- Renews a near cache's coherence lease.
-- KEYS[1]: the prefix's lease registry (a hash: holder id -> lease end, in the
--          server's milliseconds; "~since" -> when the registry was created)
-- KEYS[2]: the registry of versions before 0.4, under the prefix (KEYS[1]
--          itself when an ACL refused KEYS[1]'s name); a per-key holder's:
--          the prefix's registry
-- KEYS[3]: (a per-key holder's, unless an ACL refused KEYS[1]'s name) the
--          registry of versions before 0.4
-- ARGV[1]: the holder's id
-- ARGV[2]: the lease, in milliseconds
-- ARGV[3]: '1' for a per-key holder (KEYS[1] is then the per-key registry,
--          see confirm_keys.lua, and KEYS[2] the prefix's registry)
-- Returns the server's time in milliseconds and its run_id: the holder
-- checks that its tracking connections are on this very server (after a
-- failover or a proxy's switch they may not be).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('HSETNX', KEYS[1], '~since', now)
redis.call('HSET', KEYS[1], ARGV[1], now + lease)
if ARGV[3] == '1' and KEYS[2] ~= KEYS[1] then
  -- The last per-key lease's end: writers learn in one read whether any runs.
  local last = tonumber(redis.call('HGET', KEYS[1], '~until')) or 0
  if last < now + lease then
    redis.call('HSET', KEYS[1], '~until', now + lease)
  end
end
-- Renewed every quarter lease while a holder lives; gone three leases after
-- the last one stopped (a registry found missing is waited out as lost).
redis.call('PEXPIRE', KEYS[1], lease * 3)
-- Processes of earlier versions read only their registry, which they keep
-- while they run (its expiry is theirs): hold a lease there too while it
-- exists, and say it was seen, so that writers notice if it is lost
-- (confirm.lua). A per-key holder does so in both registries of earlier
-- versions (KEYS[2], and KEYS[3], the one before 0.4; confirm_keys.lua).
if KEYS[2] ~= KEYS[1] and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], now + lease)
  redis.call('HSETNX', KEYS[1], '~legacy', now)
end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], ARGV[1], now + lease)
  redis.call('HSETNX', KEYS[1], '~older', now)
end
-- Holders that died without Close are forgotten by writers (confirm.lua),
-- which read the whole registry anyway: a renewal costs the same with one
-- process or a thousand.
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
return {now, run or ''}
