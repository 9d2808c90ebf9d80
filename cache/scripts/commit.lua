-- Write the loaded record and release the lock, only if the lock still holds
-- our token. A holder whose lease ran out or whose key was deleted meanwhile
-- writes nothing, so it can never overwrite a newer value. Then wake the
-- waiters: a message with the key on the channel of its slot (SPUBLISH on
-- Redis 7+, PUBLISH before; waiters subscribe the same way).
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] token, ARGV[2] record, ARGV[3] TTL in ms, ARGV[4] channel ("": none)
-- Returns 1 when written, 0 when the lock was no longer ours.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
if ARGV[4] ~= '' then
  local ok = redis.pcall('SPUBLISH', ARGV[4], KEYS[1])
  if type(ok) == 'table' and ok.err then
    redis.pcall('PUBLISH', ARGV[4], KEYS[1])
  end
end
return 1
