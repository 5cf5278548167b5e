-- Included by leave.lua and reap_consumers.lua (store/scripts.py): once consumers have left
-- the named subscription of KEYS[1] (definition HASH) and KEYS[2] (consumers HASH), delete a
-- volatile one that has none left, with its entry in the index SET KEYS[3] (ARGV[2] is its id).
-- Returns {consumers left, topic of the deleted subscription or ''}.
local function last_consumer()
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
end
