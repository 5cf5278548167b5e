-- Create a subscription (consumer group) on every band of an address.
--
-- KEYS[1..10] the streams of bands 0..9, KEYS[11] groups SET
-- ARGV[1] group name
-- ARGV[2] start id: '0' (sees stored messages: queues) or '$' (only later ones: topics)
-- Idempotent: an existing group keeps its position.
for i = 1, 10 do
  local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[i], ARGV[1], ARGV[2], 'MKSTREAM')
  if not ok and not string.find(tostring(err), 'BUSYGROUP') then
    return redis.error_reply(tostring(err))
  end
end
return redis.call('SADD', KEYS[11], ARGV[1])
