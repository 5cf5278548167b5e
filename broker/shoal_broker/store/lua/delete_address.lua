-- Delete an address with every key of it, in one step on its slot; the caller then removes it
-- from the global index only while the index still names this epoch (index_forget.lua).
--
-- KEYS[1] meta HASH, KEYS[2..] the address's other keys (streams, groups, each group's keys,
-- schedule, watchers, commit markers, duplicate window)
-- Returns {kind, epoch} it had (false for either it lacked: an address of the older layout).
local meta = redis.call('HMGET', KEYS[1], 'kind', 'epoch')
redis.call('DEL', unpack(KEYS))
return meta
