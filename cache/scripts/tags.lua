-- DeleteByTag and Clear: advance the prefix's tag clock and set each version
-- key (a tag's, or the Cache's) to it. A stamped record whose clock is older
-- than one of its versions is no longer current.
-- KEYS[1] the clock, KEYS[2..] version keys
-- ARGV[1] how long the clock and the versions are kept at least, in ms
-- (stamped records live less).
-- The clock never runs backwards, even once it expired with every version:
-- it moves to at least the server's time in microseconds, past every clock
-- a record may still carry.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = string.format('%.0f', math.max(tonumber(redis.call('GET', KEYS[1]) or '0') + 1, now))
local keep = tonumber(ARGV[1])
redis.call('SET', KEYS[1], v, 'PX', keep)
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], v, 'PX', math.max(redis.call('PTTL', KEYS[i]), keep))
end
return v
