-- Write a value given by the application (write-through) and void any load
-- in flight: its lock is deleted, so its fenced commit writes nothing over
-- this newer value. Then wake the waiters (see commit.lua).
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] record, ARGV[2] TTL in ms, ARGV[3] channel ("": none)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
if ARGV[3] ~= '' then
  local ok = redis.pcall('SPUBLISH', ARGV[3], KEYS[1])
  if type(ok) == 'table' and ok.err then
    redis.pcall('PUBLISH', ARGV[3], KEYS[1])
  end
end
return 1
