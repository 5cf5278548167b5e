-- publish_unique.lua for a last-value queue (docs/architecture.md#last-value-queues): per key value
-- (an application property, keys.AddressKeys.last_values) the queue keeps only the newest message
-- its group has not read yet. The entry a new message replaces is deleted from its stream in the
-- same step that adds the new one; an entry the group has read (delivered, unsettled, or returned
-- by a consumer) is never touched: the new message is added beside it.
--
-- KEYS[1] stream   STREAM of the band written
-- KEYS[2] groups   SET subscription names of the address
-- KEYS[3] watchers HASH of the address (notify_watchers.lua)
-- KEYS[4] ids      ZSET the address's duplicate window (duplicate_window.lua)
-- KEYS[5..14] the STREAMs of bands 0..9
-- KEYS[15] values  HASH key value -> '<band>|<padded entry id>' of its newest entry
-- KEYS[16] order   ZSET (scores 0) '<band>|<padded entry id>|<key value>', one per field of values
-- KEYS[17] levels  SET of the address's bands in use (mark_band.lua)
-- ARGV[1] kind, ARGV[2] channel, ARGV[3] replica: as publish.lua
-- ARGV[4] window    ids remembered at most, '0' = no duplicate detection; ARGV[5] window ms
-- ARGV[6] limit, ARGV[7] overflow: as publish_unique.lua
-- ARGV[8] group     the queue's consumer group
-- ARGV[9] band      the band written (0..9)
-- ARGV[10..] sextuples: header, rest, expiry, origin as in publish.lua, the duplicate id ('' =
--            unchecked), the key value ('' = none: stored, never replaced)
-- Messages of one call with the same key value: only the last is added, the others count as
-- replaced. Memory: values and order hold one field per key value whose newest entry was added
-- here; each call drops up to 2 * messages + 16 of those the group has read past (delivered,
-- acknowledged, trimmed, expired or removed entries alike), so they stay about as many as the
-- key values waiting in the queue.
-- Returns as publish_unique.lua when nothing is stored (0, -1, -2), else {entries added,
-- duplicates dropped, values replaced}.
if redis.call('SCARD', KEYS[2]) == 0 then
  if ARGV[1] == 'topic' then return 0 end
  return -1
end
--! include duplicate_window
--! include new_entry_fields
--! include drop_oldest
--! include notify_watchers
--! include trim_consumed
--! include backlog_held
--! include mark_band
local function padded(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return string.format('%015d-%010d', tonumber(ms), tonumber(seq))
end
local function raw(ref)  -- '<band>|<padded id>' -> the entry id
  return string.format('%d-%d', tonumber(string.sub(ref, 3, 17)), tonumber(string.sub(ref, 19, 28)))
end
local group = ARGV[8]
local read = {}  -- band -> padded last-delivered-id of the group, false: nothing read
local used = {5}  -- the default band and those in use: the others hold nothing
for _, b in ipairs(redis.call('SMEMBERS', KEYS[17])) do used[#used + 1] = tonumber(b) end
for band = 0, 9 do read[band] = false end
for _, band in ipairs(used) do
  if redis.call('EXISTS', KEYS[5 + band]) == 1 then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[5 + band])) do
      local info = {}
      for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
      if info['name'] == group then read[band] = padded(info['last-delivered-id']) end
    end
  end
end
local sextuples = (#ARGV - 9) / 6
-- forget the entries the group has read past, at most 2 per message and 16 more
local sweep = 2 * sextuples + 16
for _, band in ipairs(used) do
  if read[band] and sweep > 0 then
    local past = redis.call('ZRANGEBYLEX', KEYS[16], '[' .. band .. '|',
                            '(' .. band .. '|' .. read[band] .. '|\255', 'LIMIT', 0, sweep)
    for _, member in ipairs(past) do
      local value = string.sub(member, 30)
      if redis.call('HGET', KEYS[15], value) == string.sub(member, 1, 28) then
        redis.call('HDEL', KEYS[15], value)
      end
    end
    if #past > 0 then redis.call('ZREM', KEYS[16], unpack(past)) end
    sweep = sweep - #past
  end
end
local dedup = tonumber(ARGV[4]) > 0
local now = dedup and window_open(KEYS[4], tonumber(ARGV[5]))
local fresh, seen, duplicates, last = {}, {}, 0, {}
for i = 10, #ARGV, 6 do
  local id = ARGV[i + 4]
  if dedup and id ~= '' and window_has(KEYS[4], id, seen) then
    duplicates = duplicates + 1
  else
    if dedup and id ~= '' then seen[id] = true end
    fresh[#fresh + 1] = i
    if ARGV[i + 5] ~= '' then last[ARGV[i + 5]] = i end
  end
end
-- what each key value replaces: its newest entry, unless the group has read it (or it is gone:
-- looked up only for a limit, which counts what is deleted; XDEL says it otherwise)
local limit = tonumber(ARGV[6])
local doomed, replaced, kept, refs = {}, 0, {}, {}
for value, _ in pairs(last) do
  local ref = redis.call('HGET', KEYS[15], value)
  if ref then
    refs[value] = ref
    local band = tonumber(string.sub(ref, 1, 1))
    local id = raw(ref)
    if (not read[band] or string.sub(ref, 3) > read[band])
        and (limit == 0 or #redis.call('XRANGE', KEYS[5 + band], id, id) > 0) then
      doomed[#doomed + 1] = {band, id}
    end
  end
end
for _, i in ipairs(fresh) do
  local value = ARGV[i + 5]
  if value == '' or last[value] == i then kept[#kept + 1] = i else replaced = replaced + 1 end
end
local excess = 0
if limit > 0 and #kept > 0 then
  local held = backlog_held(5) - #doomed
  if held + #kept > limit then
    for b = 5, 14 do trim_consumed(KEYS[b]) end
    held = backlog_held(5) - #doomed
    if ARGV[7] == 'reject-publish' and held + #kept > limit then return -2 end
  end
  excess = held + #kept - limit
end
if dedup then window_add(KEYS[4], seen, now, tonumber(ARGV[4]), tonumber(ARGV[5])) end
for _, d in ipairs(doomed) do  -- its order member goes with the new entry's (below)
  replaced = replaced + redis.call('XDEL', KEYS[5 + d[1]], d[2])
end
for _, i in ipairs(kept) do
  local id = redis.call('XADD', KEYS[1], '*', unpack(new_entry_fields(ARGV[i], ARGV[i + 1],
                                                                      ARGV[i + 2], ARGV[i + 3])))
  local value = ARGV[i + 5]
  if value ~= '' then
    local ref = ARGV[9] .. '|' .. padded(id)
    if refs[value] then redis.call('ZREM', KEYS[16], refs[value] .. '|' .. value) end
    redis.call('HSET', KEYS[15], value, ref)
    redis.call('ZADD', KEYS[16], 0, ref .. '|' .. value)
  end
end
drop_oldest(5, excess)
if #kept > 0 then mark_band(KEYS[17], KEYS[1]) end
if #kept > 0 and ARGV[2] ~= '' then notify_watchers(KEYS[3], ARGV[2], ARGV[3]) end
return {#kept, duplicates, replaced}
