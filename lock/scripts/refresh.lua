-- Set the standalone lock's lease to a new TTL only if it still holds our
-- value. KEYS[1] lock key; ARGV[1] value (token then metadata), ARGV[2] lease
-- in ms. Returns 1 when extended, 0 when the lock was not ours.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
