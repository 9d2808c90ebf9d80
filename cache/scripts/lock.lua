-- Take the load lock of a key whose value is present, to refresh it, only if
-- the value is still the one the refresher read: a refresh triggered by a
-- read that another process's refresh has already replaced must not run.
-- KEYS[1] value key (it also routes the script to the value's shard on a
-- redis.Ring, where the lock lives), KEYS[2] lock key.
-- ARGV[1] token, ARGV[2] lease in ms, ARGV[3] the start of the record read
-- (its header and freshness metadata, which differ between writes).
-- Returns 1 when taken, 0 when held or the value changed.
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[3]) ~= ARGV[3] then
  return 0
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
