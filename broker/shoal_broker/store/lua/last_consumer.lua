-- Included by leave.lua and reap_consumers.lua (store/scripts.py): once consumers have left
-- the named subscription of KEYS[1] (definition HASH) and KEYS[2] (consumers HASH), delete a
-- volatile one that has none left (the caller takes it out of the index).
-- Returns {consumers left, topic of the deleted subscription or '', its epoch or ''}.
local function last_consumer()
  local left = redis.call('HLEN', KEYS[2])
  -- a volatile subscription declared by a SharedSubscription resource (field ``owner``) stays
  if left == 0 and redis.call('HGET', KEYS[1], 'durable') == '0'
      and redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
    local d = redis.call('HMGET', KEYS[1], 'topic', 'epoch')
    redis.call('DEL', KEYS[1], KEYS[2])
    return {0, d[1], d[2] or ''}
  end
  return {left, '', ''}
end
