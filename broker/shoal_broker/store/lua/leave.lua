-- A consumer leaves a named subscription; a volatile one goes with its last consumer.
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH, KEYS[3] subscription index SET
-- ARGV[1] consumer key, ARGV[2] subscription id
-- Returns {consumers left, topic of a deleted volatile subscription or ''}; the caller deletes
-- that topic's consumer group (its messages) when a topic is returned.
redis.call('HDEL', KEYS[2], ARGV[1])
local left = redis.call('HLEN', KEYS[2])
-- a volatile subscription declared by a SharedSubscription resource (field ``owner``) stays
if left == 0 and redis.call('HGET', KEYS[1], 'durable') == '0'
    and redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  local topic = redis.call('HGET', KEYS[1], 'topic')
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('SREM', KEYS[3], ARGV[2])
  return {0, topic}
end
return {left, ''}
