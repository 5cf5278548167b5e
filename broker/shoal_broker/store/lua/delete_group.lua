-- Delete a subscription with its pending, returned, delivery-count, sharing and delivered state.
--
-- KEYS[1..10] the streams of bands 0..9, KEYS[11] groups SET,
-- KEYS[12] returned ZSET of the group, KEYS[13] delivery-count HASH of the group,
-- KEYS[14] shares HASH of the group, KEYS[15] per-replica delivered HASH of the group
-- ARGV[1] group name
for i = 1, 10 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('XGROUP', 'DESTROY', KEYS[i], ARGV[1])
  end
end
redis.call('DEL', KEYS[12], KEYS[13], KEYS[14], KEYS[15])
return redis.call('SREM', KEYS[11], ARGV[1])
