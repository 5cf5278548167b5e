-- Delete a declared subscription (its resource was deleted with deletionPolicy Delete or
-- DeleteIfEmpty), or release it (Retain: it stays, no longer declared, apps may unsubscribe it).
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH, KEYS[3] subscription index SET,
-- KEYS[4] provisioned index HASH
-- ARGV[1] subscription id, ARGV[2] owner '<namespace>/<name>', ARGV[3] 'delete' or 'release'
-- Returns {'missing'}, {'foreign', owner}, {'in-use', consumers}, {'released', ''} or
-- {'deleted', topic}; on 'deleted' the caller deletes the topic's consumer group (the backlog).
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HDEL', KEYS[4], 'subscription:' .. ARGV[1])
  return {'missing'}
end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[2] then return {'foreign', owner} end
redis.call('HDEL', KEYS[4], 'subscription:' .. ARGV[1])
if ARGV[3] == 'release' then
  redis.call('HDEL', KEYS[1], 'owner', 'generation')
  return {'released', ''}
end
local attached = redis.call('HLEN', KEYS[2])
if attached > 0 then
  redis.call('HSET', KEYS[4], 'subscription:' .. ARGV[1], ARGV[2])
  return {'in-use', attached}
end
local topic = redis.call('HGET', KEYS[1], 'topic')
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
return {'deleted', topic}
