-- Return the cached record, or else try to take the load lock, in one round
-- trip so that no commit can slip between the read and the lock attempt.
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] token, ARGV[2] lock TTL in ms,
-- ARGV[3] bytes the caller could not decode ("" if none): treated as absent.
-- Returns {1, record} on a hit, {0, 1} when the lock was taken, {0, 0} when
-- someone else holds it.
-- A value of another type (WRONGTYPE) is not ours: treat it as absent too.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and v ~= ARGV[3] then
  return {1, v}
end
-- Already ours: the client resent the script after losing the reply to a
-- run that took the lock. Without this the holder would wait on itself.
local holder = redis.call('GET', KEYS[2])
if holder == ARGV[1] then
  return {0, 1}
end
if not holder and redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, 1}
end
return {0, 0}
