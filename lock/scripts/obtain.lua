-- Take the standalone lock, or take it again when the caller already holds
-- it (same token): a client that resent the script after losing the reply,
-- or a holder that restarted with its own token (WithLockToken).
-- KEYS[1] lock key
-- ARGV[1] value (token then metadata), ARGV[2] token length, ARGV[3] lease in ms
-- Returns 1 when the lock is ours, 0 when someone else holds it.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
  return 1
end
-- A value of another type (WRONGTYPE) is not ours: pcall returns a table.
local held = redis.pcall('GET', KEYS[1])
local n = tonumber(ARGV[2])
if type(held) == 'string' and string.sub(held, 1, n) == string.sub(ARGV[1], 1, n) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return 1
end
return 0
