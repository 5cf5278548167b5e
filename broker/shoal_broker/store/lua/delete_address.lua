-- Delete an address with every key of it, in one step on its slot; the caller then removes it
-- from the global index only while the index still names this epoch (index_forget.lua).
--
-- KEYS[1] meta HASH, KEYS[2] index ZSET of its big messages' bodies (store/bodies.py),
-- KEYS[3..] the address's other keys (streams, groups, each group's keys, schedule, watchers,
-- commit markers, duplicate window)
-- Returns {kind, epoch, member...}: the kind and epoch it had (false for either it lacked: an
-- address of the older layout), then the index members still there. The caller deletes their
-- bodies before this call, a page at a time; what a publish added since is deleted after it,
-- from these members (a body's key is not known before, so a script cannot declare it).
local meta = redis.call('HMGET', KEYS[1], 'kind', 'epoch')
local left = redis.call('ZRANGE', KEYS[2], 0, -1)
redis.call('DEL', unpack(KEYS))
return {meta[1], meta[2], unpack(left)}
