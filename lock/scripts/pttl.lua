-- The standalone lock's remaining lease, only if it still holds our value.
-- KEYS[1] lock key; ARGV[1] value (token then metadata).
-- Returns the lease in ms (-1 if someone removed its expiry), or -3 when the
-- lock is not ours.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -3
