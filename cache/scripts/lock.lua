-- Take the load lock of a key whose value is present, to refresh it.
-- KEYS[1] value key (it routes the script to the value's shard on a
-- redis.Ring, where the lock lives), KEYS[2] lock key.
-- ARGV[1] token, ARGV[2] lease in ms. Returns 1 when taken, 0 when held.
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
