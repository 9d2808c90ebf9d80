-- Write the loaded record and release the lock, only if the lock still holds
-- our token. A holder whose lease ran out or whose key was deleted meanwhile
-- writes nothing, so it can never overwrite a newer value.
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] token, ARGV[2] record, ARGV[3] TTL in ms
-- Returns 1 when written, 0 when the lock was no longer ours.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
