-- Remove a dead replica's consumers from one named subscription.
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH
-- ARGV[1] dead replica id, ARGV[2] subscription id
-- Returns {consumers left, topic of a volatile subscription deleted with its last consumer or '',
-- its epoch or ''}.
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  if fields[i + 1] == ARGV[1] then redis.call('HDEL', KEYS[2], fields[i]) end
end
--! include last_consumer
return last_consumer()
