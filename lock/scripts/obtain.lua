-- Take the standalone lock, or take it again when the caller already holds
-- it (same token): a client that resent the script after losing the reply,
-- or a holder that restarted with its own token (WithToken).
-- KEYS[1] lock key; KEYS[2], only for a fenced lock (Obtain): its fencing
-- counter, in KEYS[1]'s slot, never expiring.
-- ARGV[1] value (token then metadata), ARGV[2] token length, ARGV[3] lease in ms
-- Returns 0 when someone else holds the lock; when it is ours, the new fence
-- (the counter after INCR, so at least 1), or 1 when KEYS[2] is absent.
-- Every acquisition, a re-entrant one included, increments the counter in
-- the same script as the SET, so no holder can see the lock without its
-- fence or the fence without the lock. The counter is incremented before the
-- SET: if it cannot be (not an integer, at its maximum), the script returns
-- the error and has changed nothing.
local function fence()
  if #KEYS < 2 then
    return 1
  end
  local f = redis.pcall('INCR', KEYS[2])
  if type(f) == 'table' then
    local msg = string.gsub(f.err, '^%u+ ', '')
    return redis.error_reply('ERR fencing counter ' .. KEYS[2] .. ': ' .. msg)
  end
  return f
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local f = fence()
  if type(f) == 'table' then
    return f
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return f
end
-- A value of another type (WRONGTYPE) is not ours: pcall returns a table.
local held = redis.pcall('GET', KEYS[1])
local n = tonumber(ARGV[2])
if type(held) == 'string' and string.sub(held, 1, n) == string.sub(ARGV[1], 1, n) then
  local f = fence()
  if type(f) == 'table' then
    return f
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return f
end
return 0
