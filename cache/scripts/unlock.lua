-- Give up a load lock, or extend its lease, only if it still holds our token.
-- A release wakes the waiters as a commit does (see commit.lua).
-- KEYS[1] value key (it also routes the script to the value's shard on a
-- redis.Ring, where the lock lives), KEYS[2] lock key.
-- ARGV[1] token, ARGV[2] new lease in ms, or "" to release,
-- ARGV[3] channel ("": none).
-- Returns 1 when done, 0 when the lock was no longer ours.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '' then
  return redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
redis.call('DEL', KEYS[2])
if ARGV[3] ~= '' then
  local ok = redis.pcall('SPUBLISH', ARGV[3], KEYS[1])
  if type(ok) == 'table' and ok.err then
    redis.pcall('PUBLISH', ARGV[3], KEYS[1])
  end
end
return 1
