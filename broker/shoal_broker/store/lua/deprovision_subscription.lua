-- Delete a declared subscription (its resource was deleted with deletionPolicy Delete or
-- DeleteIfEmpty), or release it (Retain: it stays, no longer declared, apps may unsubscribe it).
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH (the caller updates the indexes)
-- ARGV[1] subscription id, ARGV[2] owner '<namespace>/<name>', ARGV[3] 'delete' or 'release'
-- Returns {'missing'}, {'foreign', owner}, {'in-use', consumers}, {'released', ''} or
-- {'deleted', topic, epoch}; on 'deleted' the caller deletes the topic's consumer group (the
-- backlog) and forgets the epoch in the subscription index.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'missing'}
end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[2] then return {'foreign', owner} end
if ARGV[3] == 'release' then
  redis.call('HDEL', KEYS[1], 'owner', 'generation')
  return {'released', ''}
end
local attached = redis.call('HLEN', KEYS[2])
if attached > 0 then
  return {'in-use', attached}
end
local d = redis.call('HMGET', KEYS[1], 'topic', 'epoch')
redis.call('DEL', KEYS[1], KEYS[2])
return {'deleted', d[1], d[2] or ''}
