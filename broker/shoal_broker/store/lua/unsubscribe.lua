-- Delete a durable subscription (JMS unsubscribe), unless a consumer is attached anywhere.
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH
-- ARGV[1] the unsubscribing link's own consumer key (not counted), ARGV[2] subscription id
-- Returns {'missing'}, {'owned', owner}, {'locked', consumers}, or {'deleted', topic, epoch}; on
-- 'deleted' the caller deletes the topic's consumer group and forgets the epoch in the index. A subscription declared by a
-- SharedSubscription resource (field ``owner``, ``<namespace>/<name>``) is never deleted here.
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
redis.call('HDEL', KEYS[2], ARGV[1])
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner then return {'owned', owner} end
local attached = redis.call('HLEN', KEYS[2])
if attached > 0 then return {'locked', attached} end
local d = redis.call('HMGET', KEYS[1], 'topic', 'epoch')
redis.call('DEL', KEYS[1], KEYS[2])
return {'deleted', d[1], d[2] or ''}
