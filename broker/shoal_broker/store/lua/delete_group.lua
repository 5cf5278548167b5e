-- Delete a subscription with its pending, returned, delivery-count, sharing and delivered state.
--
-- KEYS[1] stream band 0, KEYS[2] stream band 1, KEYS[3] groups SET,
-- KEYS[4] returned ZSET of the group, KEYS[5] delivery-count HASH of the group,
-- KEYS[6] shares HASH of the group, KEYS[7] per-replica delivered HASH of the group
-- ARGV[1] group name
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('XGROUP', 'DESTROY', KEYS[i], ARGV[1])
  end
end
redis.call('DEL', KEYS[4], KEYS[5], KEYS[6], KEYS[7])
return redis.call('SREM', KEYS[3], ARGV[1])
