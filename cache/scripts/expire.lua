-- Expire a value by hand: replace its record by the expired copy the caller
-- made of it, only if it is still the one the caller read (a write since
-- then is newer than the expiry, which has nothing left to do), keeping its
-- TTL; void any load in flight and wake the waiters, as set.lua does.
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] the record read, ARGV[2] its expired copy, ARGV[3] channel ("": none)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
redis.call('DEL', KEYS[2])
if ARGV[3] ~= '' then
  local ok = redis.pcall('SPUBLISH', ARGV[3], KEYS[1])
  if type(ok) == 'table' and ok.err then
    redis.pcall('PUBLISH', ARGV[3], KEYS[1])
  end
end
return 1
