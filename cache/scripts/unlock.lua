-- Give up a load lock, or extend its lease, only if it still holds our token.
-- KEYS[1] value key (unused here: it routes the script to the value's shard on
-- a redis.Ring, where the lock lives), KEYS[2] lock key.
-- ARGV[1] token, ARGV[2] new lease in ms, or "" to release.
-- Returns 1 when done, 0 when the lock was no longer ours.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  return redis.call('DEL', KEYS[2])
end
return redis.call('PEXPIRE', KEYS[2], ARGV[2])
