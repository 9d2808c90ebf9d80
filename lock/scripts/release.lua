-- Delete the standalone lock only if it still holds our value.
-- KEYS[1] lock key; ARGV[1] value (token then metadata).
-- Returns 1 when released, 0 when the lock was not ours.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
