-- A replica lets go of some message groups it owns in one subscription: idle ones (nothing of
-- them unsettled or waiting on it for a while), or all those not in flight when a consumer joins
-- an entity with group rebalancing (docs/architecture.md, "Message groups").
--
-- KEYS[1] owners HASH, KEYS[2] held ZSET of the subscription's message groups
-- ARGV[1] the replica, ARGV[2..] the groups
-- A group another replica owns by now is left alone. Returns the number let go.
local forgotten = 0
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    forgotten = forgotten + 1
  end
  redis.call('ZREM', KEYS[2], ARGV[1] .. '|' .. ARGV[i])
end
return forgotten
