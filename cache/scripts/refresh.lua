-- Extend the lock's lease only if it still holds our token.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] TTL in ms. Returns 1 or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
