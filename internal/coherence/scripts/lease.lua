-- Renews a near cache's coherence lease.
-- KEYS[1]: the prefix's lease registry (a hash: holder id -> lease end, in the
--          server's milliseconds; "~since" -> when the registry was created)
-- ARGV[1]: the holder's id
-- ARGV[2]: the lease, in milliseconds
-- Returns the server's time in milliseconds and its run_id: the holder
-- checks that its tracking connections are on this very server (after a
-- failover or a proxy's switch they may not be).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('HSETNX', KEYS[1], '~since', now)
redis.call('HSET', KEYS[1], ARGV[1], now + lease)
-- Renewed every quarter lease while a holder lives; gone three leases after
-- the last one stopped (a registry found missing is waited out as lost).
redis.call('PEXPIRE', KEYS[1], lease * 3)
-- Forget holders whose lease ended a lease ago (a process that died without
-- Close): the registry stays as small as the number of live processes.
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= '~since' and tonumber(all[i + 1]) < now - lease then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
return {now, run or ''}
