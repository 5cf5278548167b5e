-- Append messages to one band of an address, unless it is a topic nobody subscribes to.
--
-- KEYS[1] stream   STREAM of the band
-- KEYS[2] groups   SET subscription names of the address
-- KEYS[3] watchers HASH of the address (notify_watchers.lua)
-- KEYS[4] levels   SET of the address's bands in use (mark_band.lua)
-- KEYS[5] index    ZSET of the address's big messages, KEYS[6..] the bodies of the big ones among
--                  the messages (store/bodies.py), deleted when the messages are refused
-- ARGV[1] kind     'queue' or 'topic'
-- ARGV[2] channel  the address's notification channel, '' when the caller announces (a commit)
-- ARGV[3] replica  this replica's id
-- ARGV[4..] quadruples: header bytes, rest bytes, expiry (ms since epoch, '0' = never),
--           origin (the publishing connection's container-id, for no-local; '' = none)
-- Other replicas' consumers are woken here rather than by a notify.lua call of its own: one Lua
-- call less per cycle, on the path of every message at a trickle.
-- Returns the number of entries added: 0 when a topic had no subscription (nothing kept: a
-- message published before a subscriber attached is never delivered to it), -1 when a queue no
-- longer exists (its group is gone: deleted meanwhile, e.g. a temporary queue).
--! include append_entries
if redis.call('SCARD', KEYS[2]) == 0 then
  forget_bodies(6)
  if ARGV[1] == 'topic' then return 0 end
  return -1
end
--! include notify_watchers
--! include mark_band
local added = append_entries(4, nil, KEYS[5])
mark_band(KEYS[4], KEYS[1])
if ARGV[2] ~= '' then notify_watchers(KEYS[3], ARGV[2], ARGV[3]) end
return added
