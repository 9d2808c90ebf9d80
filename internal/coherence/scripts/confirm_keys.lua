-- A write's confirmation on a single server or a cluster, where near caches
-- may hold keys per key: sent once the write returned, it announces the
-- write to the per-key holders of its keys, and to every holder that
-- tracks by prefix, and lists who may still hold an old value.
-- KEYS[1]: the prefix's per-key registry (holder id -> lease end, in the
--          server's milliseconds; "~since" -> its creation; "~until" -> the
--          last per-key lease's end; "~legacy", "~older" -> KEYS[2],
--          KEYS[3] was seen), which
--          only per-key holders renew
-- KEYS[2]: the prefix's registry (see confirm.lua), renewed by holders that
--          track by prefix (earlier versions, a Ring's) and by per-key
--          holders while it exists: while it does, every write waits for
--          everyone in it
-- KEYS[3]: the registry of versions before 0.4, read while it exists
-- KEYS[4]: the marker key (single server): written and deleted, so that it
--          follows the write's invalidation to the holders that track by
--          prefix (see confirm.lua)
-- KEYS[5..]: (single server) the holders hashes of the written keys, read
--          here, after the write
-- ARGV[1]: the prefix's marker channel
-- ARGV[2]: the marker: the writer's id and the write's sequence number
-- ARGV[3]: '1': the write is of keys every per-key holder tracks (the tag
--          and Clear versions): all of them confirm it
-- ARGV[4]: what the per-key holders' own marker channels begin with
-- ARGV[5]: '1' on a single server: the marker key, not a PUBLISH, tells
--          the holders that track by prefix
-- ARGV[6..]: holders of the written keys read by the caller (a cluster's
--          keys lie in other slots)
-- Returns {now, since, flags, holder, lease end, ..., ['~dead', holder,
-- ...]}, the holders the writer removes from its keys' hashes last, times in the
-- server's milliseconds; flags: 1 when some per-key lease runs (a
-- cluster's writer then reads its keys' holders and calls again), plus 2
-- when the write was announced to every holder of the prefix (to ask
-- again, the writer announces it the same way, else to its holders alone).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- (HSETNX only when missing: a write command fails under maxmemory.)
if redis.call('HEXISTS', KEYS[1], '~since') == 0 then
  redis.pcall('HSETNX', KEYS[1], '~since', now)
end
local out = {now, 0, 0}
local function list(registry, own)
  local all = redis.call('HGETALL', registry)
  for i = 1, #all, 2 do
    local id, v = all[i], tonumber(all[i + 1])
    if id == '~since' and registry ~= KEYS[1] then
      out[2] = math.max(out[2], v)
    elseif string.sub(id, 1, 1) == '~' then
    elseif own and v < now - 60000 then
      redis.call('HDEL', registry, id) -- gone a minute: forgotten (confirm.lua)
    else
      out[#out + 1] = id
      out[#out + 1] = v
    end
  end
end
local bcast = redis.call('EXISTS', KEYS[2]) == 1
local older = KEYS[3] ~= KEYS[2] and redis.call('EXISTS', KEYS[3]) == 1
-- The holders that track by prefix, and every per-key holder for the keys
-- they all track: on a single server by the marker key, whose broadcast
-- invalidation Redis sends at the end of the event-loop turn, with or
-- after the write's (a PUBLISH here could overtake it); elsewhere by a
-- PUBLISH, which follows the write, since the write returned.
local everyone = bcast or older or ARGV[3] == '1'
if everyone then
  out[3] = 2
  if ARGV[5] == '1' then
    redis.call('SET', KEYS[4], '1')
    redis.call('DEL', KEYS[4])
  else
    redis.call('PUBLISH', ARGV[1], ARGV[2])
  end
end
if bcast then
  list(KEYS[2], true) -- its holders' renewals keep it, not the writers
  if redis.call('HEXISTS', KEYS[1], '~legacy') == 0 then
    redis.pcall('HSET', KEYS[1], '~legacy', now)
  end
elseif redis.call('HEXISTS', KEYS[1], '~legacy') == 1 then
  -- KEYS[2] was lost while leases may have run there (an eviction, say):
  -- waited out as a new registry is.
  redis.call('HDEL', KEYS[1], '~legacy')
  redis.pcall('HSET', KEYS[1], '~since', now)
  out[2] = now
else
  -- A per-key registry created within a lease (first use, or lost) may
  -- have forgotten leases that still run. (While KEYS[2] exists, per-key
  -- holders renew there too, and its own creation counts instead.)
  out[2] = tonumber(redis.call('HGET', KEYS[1], '~since')) or now -- (not made: maxmemory)
end
if older then
  list(KEYS[3], false)
  if redis.call('HEXISTS', KEYS[1], '~older') == 0 then
    redis.pcall('HSET', KEYS[1], '~older', now)
  end
elseif redis.call('HEXISTS', KEYS[1], '~older') == 1 then
  -- The same for the registry of versions before 0.4 (confirm.lua).
  redis.call('HDEL', KEYS[1], '~older')
  out[2] = now
  redis.pcall('HSET', KEYS[1], '~since', now)
end
if ARGV[3] == '1' then
  list(KEYS[1], true)
else
  local seen = {}
  local dead = {}
  -- A holder whose lease ended over a minute ago is gone (or frozen that
  -- long, past what its memory may keep): its registrations are removed
  -- here, on a single server, or by the writer, on a cluster.
  local function holder(id, hash)
    if seen[id] == nil then
      local v = tonumber(redis.call('HGET', KEYS[1], id))
      seen[id] = v and v < now - 60000
      if v and v > now then
        out[#out + 1] = id
        out[#out + 1] = v
        -- Its reads are tracked per key, whose invalidations Redis sends at
        -- once: this follows the write's.
        redis.call('PUBLISH', ARGV[4] .. id, ARGV[2])
      end
    end
    if seen[id] then
      if hash then
        redis.pcall('HDEL', hash, id)
      else
        dead[#dead + 1] = id
      end
    end
  end
  for i = 5, #KEYS do
    for _, id in ipairs(redis.call('HKEYS', KEYS[i])) do
      holder(id, KEYS[i])
    end
  end
  for i = 6, #ARGV do
    holder(ARGV[i], nil)
  end
  if #dead > 0 then
    out[#out + 1] = '~dead'
    for _, id in ipairs(dead) do
      out[#out + 1] = id
    end
  end
end
-- Whether any per-key lease runs ("~until", see lease.lua): a cluster's
-- writer reads its keys' holders only then.
if (tonumber(redis.call('HGET', KEYS[1], '~until')) or 0) > now then
  out[3] = out[3] + 1
else
  -- No per-key holder renews it: kept ten minutes past the last write, as
  -- confirm.lua keeps its registry. (PEXPIRE is allowed under maxmemory.)
  redis.call('PEXPIRE', KEYS[1], 600000)
end
return out
