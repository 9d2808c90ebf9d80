-- DeleteByTag and Clear: advance the prefix's tag clock and set each version
-- key (a tag's, or the Cache's) to it. A stamped record whose clock is older
-- than one of its versions is no longer current.
-- KEYS[1] the clock (never expires: it must not run backwards),
-- KEYS[2..] version keys
-- ARGV[1] how long a version is kept at least, in ms (records live less)
local v = redis.call('INCR', KEYS[1])
for i = 2, #KEYS do
  local left = redis.call('PTTL', KEYS[i])
  redis.call('SET', KEYS[i], v, 'PX', math.max(left, tonumber(ARGV[1])))
end
return v
