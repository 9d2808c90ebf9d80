-- Expire a value by hand: replace its record by the expired copy the caller
-- made of it, only if it is still the one the caller read (else it reads
-- again: what changed it may be a load's commit of a source read before
-- Expire), keeping its TTL. Either way, void any load in flight (it may have read the source
-- before the change that Expire announces) and wake the waiters, as set.lua
-- does.
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] the record read, ARGV[2] its expired copy, ARGV[3] channel ("": none)
-- Returns 1 when the record was expired, 0 when it had changed.
local same = redis.call('GET', KEYS[1]) == ARGV[1]
if same then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
end
redis.call('DEL', KEYS[2])
if ARGV[3] ~= '' then
  local ok = redis.pcall('SPUBLISH', ARGV[3], KEYS[1])
  if type(ok) == 'table' and ok.err then
    redis.pcall('PUBLISH', ARGV[3], KEYS[1])
  end
end
if same then
  return 1
end
return 0
