-- publish.lua with a backlog limit per address (SHOAL_MAX_BACKLOG_PER_ADDRESS).
--
-- KEYS[1] stream   STREAM of the band written
-- KEYS[2] groups   SET subscription names of the address
-- KEYS[3..12] the STREAMs of bands 0..9 (the backlog counts them all)
-- KEYS[13] watchers HASH of the address (notify_watchers.lua), KEYS[14] levels SET (mark_band.lua)
-- KEYS[15] index ZSET of the address's big messages, KEYS[16..] the bodies of the big ones among
--          the messages (store/bodies.py), deleted when the messages are refused (those of
--          entries trimmed or dropped here go with the next trim: trim.lua)
-- ARGV[1] kind     'queue' or 'topic'
-- ARGV[2] limit    entries the address may hold
-- ARGV[3] overflow 'reject-publish' (refuse the whole batch) or 'drop-oldest' (add, then trim
--                  the oldest entries, lowest priority first)
-- ARGV[4] channel, ARGV[5] replica: as ARGV[2] and ARGV[3] of publish.lua
-- ARGV[6..] quadruples as in publish.lua
-- The backlog is what the streams hold less what every subscription has consumed: over the
-- limit, the consumed entries are trimmed before deciding (left to the periodic trim, a drained
-- queue refused publishes, or dropped new ones, until it ran).
-- Returns as publish.lua, or -2 when refused as full.
--! include append_entries
if redis.call('SCARD', KEYS[2]) == 0 then
  forget_bodies(16)
  if ARGV[1] == 'topic' then return 0 end
  return -1
end
local limit = tonumber(ARGV[2])
local adding = (#ARGV - 5) / 4
--! include trim_consumed
--! include backlog_held
local held = backlog_held(3)
if held + adding > limit then
  for i = 3, 12 do trim_consumed(KEYS[i]) end
  held = backlog_held(3)
  if ARGV[3] == 'reject-publish' and held + adding > limit then
    forget_bodies(16)
    return -2
  end
end
--! include drop_oldest
--! include notify_watchers
--! include mark_band
local added = append_entries(6, nil, KEYS[15])
mark_band(KEYS[14], KEYS[1])
local excess = held + adding - limit
drop_oldest(3, excess)
if ARGV[4] ~= '' then notify_watchers(KEYS[13], ARGV[4], ARGV[5]) end
return added
