-- Delete a subscription with its pending, returned, delivery-count, sharing, delivered and message
-- group state.
--
-- KEYS[1..10] the streams of bands 0..9, KEYS[11] groups SET,
-- KEYS[12] returned ZSET of the group, KEYS[13] delivery-count HASH of the group,
-- KEYS[14] shares HASH of the group, KEYS[15] per-replica delivered HASH of the group,
-- KEYS[16..18] its message groups' owners HASH, parked ZSET and held ZSET (keys.py)
-- ARGV[1] group name
for i = 1, 10 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('XGROUP', 'DESTROY', KEYS[i], ARGV[1])
  end
end
for i = 12, #KEYS do redis.call('DEL', KEYS[i]) end
return redis.call('SREM', KEYS[11], ARGV[1])
