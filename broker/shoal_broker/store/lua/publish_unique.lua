-- publish.lua and publish_limited.lua with duplicate detection (docs/redis-modes.md#duplicate-
-- detection): a message whose id the address stored within its window is dropped, in the same
-- step that stores the others and remembers their ids. Also inside a one-slot commit's MULTI
-- (store/transactions.py), so a transaction's sends are checked when it is applied.
--
-- KEYS[1] stream   STREAM of the band written
-- KEYS[2] groups   SET subscription names of the address
-- KEYS[3] watchers HASH of the address (notify_watchers.lua)
-- KEYS[4] ids      ZSET the address's duplicate window (duplicate_window.lua)
-- KEYS[5..14] the STREAMs of bands 0..9 (the backlog, when ARGV[6] limits it)
-- KEYS[15] levels SET of the address's bands in use (mark_band.lua)
-- ARGV[1] kind, ARGV[2] channel, ARGV[3] replica: as publish.lua
-- ARGV[4] window    ids remembered at most (the newest)
-- ARGV[5] window ms how long an id is remembered
-- ARGV[6] limit     entries the address may hold, '0' = no limit; ARGV[7] overflow: as
--                   publish_limited.lua
-- ARGV[8..] quintuples: header, rest, expiry, origin as in publish.lua, then the id ('' = the
--           message has none: it is stored unchecked)
-- A message refused as a whole batch (full, or the queue gone) leaves its id unremembered: sent
-- again, it is stored. Duplicates within one call are found too (the second is dropped).
-- Returns as publish_limited.lua when nothing is stored for those reasons (0, -1, -2), else
-- {entries added, duplicates dropped}.
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
local now = window_open(KEYS[4], tonumber(ARGV[5]))
local fresh, seen, duplicates = {}, {}, 0
for i = 8, #ARGV, 5 do
  local id = ARGV[i + 4]
  if id == '' then
    fresh[#fresh + 1] = i
  elseif window_has(KEYS[4], id, seen) then
    duplicates = duplicates + 1
  else
    seen[id] = true
    fresh[#fresh + 1] = i
  end
end
local limit = tonumber(ARGV[6])
local excess = 0
if limit > 0 and #fresh > 0 then
  local held = backlog_held(5)
  if held + #fresh > limit then
    for b = 5, 14 do trim_consumed(KEYS[b]) end
    held = backlog_held(5)
    if ARGV[7] == 'reject-publish' and held + #fresh > limit then return -2 end
  end
  excess = held + #fresh - limit
end
window_add(KEYS[4], seen, now, tonumber(ARGV[4]), tonumber(ARGV[5]))
for _, i in ipairs(fresh) do
  redis.call('XADD', KEYS[1], '*', unpack(new_entry_fields(ARGV[i], ARGV[i + 1], ARGV[i + 2],
                                                           ARGV[i + 3])))
end
drop_oldest(5, excess)
if #fresh > 0 then mark_band(KEYS[15], KEYS[1]) end
if #fresh > 0 and ARGV[2] ~= '' then notify_watchers(KEYS[3], ARGV[2], ARGV[3]) end
return {#fresh, duplicates}
