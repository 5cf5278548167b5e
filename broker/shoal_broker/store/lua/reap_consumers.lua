-- Remove a dead replica's consumers from one named subscription.
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH, KEYS[3] subscription index SET
-- ARGV[1] dead replica id, ARGV[2] subscription id
-- Returns {consumers left, topic of a volatile subscription deleted with its last consumer or ''}.
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  if fields[i + 1] == ARGV[1] then redis.call('HDEL', KEYS[2], fields[i]) end
end
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
