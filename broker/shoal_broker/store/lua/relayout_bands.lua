-- Move an address of the older two-band layout (one stream for priorities 0-4, one for 5-9)
-- forward into one stream per priority (keys.AddressKeys.streams), in one step on its slot
-- (store/layout.py runs it for every address at start).
--
-- KEYS[1] older stream of priorities 0-4, KEYS[2] older stream of priorities 5-9,
-- KEYS[3..12] the streams of bands 0..9 (band = 9 - priority), KEYS[13] groups SET,
-- KEYS[14] levels SET (mark_band.lua), KEYS[15] scheduled ZSET, KEYS[16] scheduled HASH,
-- KEYS[17] last-value HASH, KEYS[18] last-value order ZSET (publish_last.lua),
-- KEYS[17 + 2i] and KEYS[18 + 2i] the returned ZSET and delivery-count HASH of group i
-- ARGV[i] group i's name
-- Every entry keeps its id and goes to its own priority's stream (read from its header). Each
-- group keeps its position: what it had acknowledged stays consumed, what it had not read stays
-- new, and what was out at a replica of the older version (pending) is returned to it, held by
-- the 'reclaimed' consumer as a dead replica's entries are (reclaim.lua), ahead of new entries
-- of its priority; returned entries keep their due time and delivery counts their value.
-- Scheduled messages get the band of their priority, a last-value queue's references the band of
-- their entry (a reference to an entry no longer stored is dropped: the queue read past it). The
-- older streams are deleted last.
-- Returns the number of entries moved; 0 when the address has nothing of the older layout; -1,
-- writing nothing, when a band stream has been written already (a replica of this version served
-- the address while one of the older version still wrote the older streams): the entries cannot
-- keep their ids there, and they stay where they are.
if redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 then return 0 end
for b = 0, 9 do
  if redis.call('EXISTS', KEYS[3 + b]) == 1 then
    local info = redis.call('XINFO', 'STREAM', KEYS[3 + b])
    for j = 1, #info, 2 do
      if info[j] == 'last-generated-id' and info[j + 1] ~= '0-0' then return -1 end
    end
  end
end

local function priority_of(h)
  -- an AMQP header section: descriptor 0x00 0x53 0x70 (or 0x00 0x80 and a ulong), a list whose
  -- second field is the priority (ubyte 0x50); absent or null: 4
  if not h or string.byte(h, 1) ~= 0 then return 4 end
  local pos
  if string.byte(h, 2) == 0x53 then pos = 4 elseif string.byte(h, 2) == 0x80 then pos = 11
  else return 4 end
  local code, count = string.byte(h, pos), 0
  if code == 0xc0 then
    count, pos = string.byte(h, pos + 2), pos + 3
  elseif code == 0xd0 then
    count, pos = string.byte(h, pos + 8), pos + 9  -- a header list has far fewer than 256
  end
  if not count or count < 2 then return 4 end
  if string.byte(h, pos) == 0x56 then pos = pos + 2 else pos = pos + 1 end  -- durable
  if string.byte(h, pos) == 0x50 then return math.min(string.byte(h, pos + 1), 9) end
  return 4
end
local function band_of(fields)
  for j = 1, #fields, 2 do
    if fields[j] == 'h' then return 9 - priority_of(fields[j + 1]) end
  end
  return 5
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function at_or_before(id, last)
  local ms, seq = parse(id)
  local lms, lseq = parse(last)
  return ms < lms or (ms == lms and seq <= lseq)
end
local function member(band, id)
  local ms, seq = parse(id)
  return string.format('%d|%015d-%010d', band, ms, seq)
end

-- each group's position on the older streams: last-delivered id and pending entries
local last, pending = {{}, {}}, {{}, {}}
for ob = 1, 2 do
  if redis.call('EXISTS', KEYS[ob]) == 1 then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[ob])) do
      local info = {}
      for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
      last[ob][info['name']] = info['last-delivered-id']
      local held = {}
      local start = '-'
      for _ = 1, 10000 do  -- bounded: 10 000 pages of 1 000
        local page = redis.call('XPENDING', KEYS[ob], info['name'], start, '+', 1000)
        for _, p in ipairs(page) do held[p[1]] = true end
        if #page < 1000 then break end
        start = '(' .. page[#page][1]
      end
      pending[ob][info['name']] = held
    end
  end
end

-- the new streams carry every group from their start
for b = 0, 9 do
  for _, g in ipairs(ARGV) do
    local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[3 + b], g, '0', 'MKSTREAM')
    if not ok and not string.find(tostring(err), 'BUSYGROUP') then
      return redis.error_reply(tostring(err))
    end
  end
end

-- the entries, each to its priority's stream with its id; per group and band, how many of them
-- it had read (they are the first ones of that band: ids only grow)
local moved, band_of_id, read = 0, {{}, {}}, {}
for i = 1, #ARGV do
  read[i] = {}
  for b = 0, 9 do read[i][b] = 0 end
end
for ob = 1, 2 do
  local start = '-'
  for _ = 1, 1000000 do  -- bounded by the stream's length, in pages of 1 000
    local batch = redis.call('XRANGE', KEYS[ob], start, '+', 'COUNT', 1000)
    for _, entry in ipairs(batch) do
      local id, fields = entry[1], entry[2]
      local b = band_of(fields)
      redis.call('XADD', KEYS[3 + b], id, unpack(fields))
      if b ~= 5 then redis.call('SADD', KEYS[14], b) end
      band_of_id[ob][id] = b
      moved = moved + 1
      for i, g in ipairs(ARGV) do
        if last[ob][g] and at_or_before(id, last[ob][g]) then read[i][b] = read[i][b] + 1 end
      end
    end
    if #batch < 1000 then break end
    start = '(' .. batch[#batch][1]
  end
end

-- each group reads again what it had read: acknowledged unless it was pending, then returned
for i, g in ipairs(ARGV) do
  local returned, counts = KEYS[17 + 2 * i], KEYS[18 + 2 * i]
  local older = redis.call('ZRANGE', returned, 0, -1, 'WITHSCORES')
  local due = {}
  for j = 1, #older, 2 do due[older[j]] = older[j + 1] end
  redis.call('DEL', returned)
  for b = 0, 9 do
    if read[i][b] > 0 then
      local res = redis.call('XREADGROUP', 'GROUP', g, 'reclaimed', 'COUNT', read[i][b],
                             'STREAMS', KEYS[3 + b], '>')
      local ob = (b >= 5) and 1 or 2
      for _, entry in ipairs(res and res[1][2] or {}) do
        local id = entry[1]
        if pending[ob][g] and pending[ob][g][id] then
          redis.call('ZADD', returned, due[member(ob - 1, id)] or 0, member(b, id))
          local count = redis.call('HGET', counts, (ob - 1) .. '|' .. id)
          if count then
            redis.call('HDEL', counts, (ob - 1) .. '|' .. id)
            redis.call('HSET', counts, b .. '|' .. id, count)
          end
        else
          redis.call('XACK', KEYS[3 + b], g, id)
        end
      end
    end
  end
end

-- scheduled messages: the band of their priority
for _, m in ipairs(redis.call('ZRANGE', KEYS[15], 0, -1)) do
  local h = redis.call('HGET', KEYS[16], m .. '|h')
  if h then redis.call('HSET', KEYS[16], m .. '|b', 9 - priority_of(h)) end
end

-- a last-value queue's references ('<band>|<padded id>', 28 characters, first in a member)
local function moved_band(ref)
  local ob = tonumber(string.sub(ref, 1, 1))
  local id = string.format('%d-%d', tonumber(string.sub(ref, 3, 17)), tonumber(string.sub(ref, 19, 28)))
  return band_of_id[ob + 1] and band_of_id[ob + 1][id]
end
local values = redis.call('HGETALL', KEYS[17])
for j = 1, #values, 2 do
  local b = moved_band(values[j + 1])
  if b then redis.call('HSET', KEYS[17], values[j], b .. string.sub(values[j + 1], 2))
  else redis.call('HDEL', KEYS[17], values[j]) end
end
for _, m in ipairs(redis.call('ZRANGE', KEYS[18], 0, -1)) do
  redis.call('ZREM', KEYS[18], m)
  local b = moved_band(m)
  if b then redis.call('ZADD', KEYS[18], 0, b .. string.sub(m, 2)) end
end

redis.call('DEL', KEYS[1], KEYS[2])
return moved
