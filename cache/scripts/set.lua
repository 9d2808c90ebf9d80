-- Write a value given by the application (write-through) and void any load
-- in flight: its lock is deleted, so its fenced commit writes nothing over
-- this newer value. Then wake the waiters (see commit.lua).
-- A versioned write (ARGV[4], the source's version as records store it) is
-- refused when the stored record carries a newer version: nothing is
-- written, deleted or published, and the script returns 0. An equal
-- version is written again (a retried Set).
-- KEYS[1] value key, KEYS[2] lock key
-- ARGV[1] record, ARGV[2] TTL in ms, ARGV[3] channel ("": none),
-- ARGV[4] version ("": none)

-- The version a record carries (see internal/record: the extensions after
-- the metadata its flags announce), or nil.
local function version(rec)
  if type(rec) ~= 'string' or #rec < 3 or string.byte(rec, 1) ~= 1 then
    return nil
  end
  local flags, n = string.byte(rec, 2, 3)
  local i, stop = 4, 4 + n -- 1-based: the metadata, and what follows it
  if stop > #rec + 1 then
    return nil
  end
  if flags % 32 >= 16 then -- freshness
    i = i + 12
    if flags >= 128 then -- the value's own TTL
      i = i + 8
    end
  end
  while i + 2 <= stop do
    local typ, len = string.byte(rec, i, i + 1)
    if i + 2 + len > stop then
      return nil
    end
    if typ == 1 and len == 8 then
      return string.sub(rec, i + 2, i + 9)
    end
    i = i + 2 + len
  end
  return nil
end

-- Whether version a is older than b, compared byte-wise (string comparison
-- would follow the server's locale).
local function older(a, b)
  for j = 1, 8 do
    local x, y = string.byte(a, j), string.byte(b, j)
    if x ~= y then
      return x < y
    end
  end
  return false
end

if ARGV[4] ~= nil and ARGV[4] ~= '' then
  local stored = version(redis.pcall('GET', KEYS[1]))
  if stored and older(ARGV[4], stored) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
if ARGV[3] ~= '' then
  local ok = redis.pcall('SPUBLISH', ARGV[3], KEYS[1])
  if type(ok) == 'table' and ok.err then
    redis.pcall('PUBLISH', ARGV[3], KEYS[1])
  end
end
return 1
