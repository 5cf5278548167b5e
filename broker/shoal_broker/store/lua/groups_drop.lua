-- A replica gives up the message groups it owns in one subscription: its last consumer there
-- left (after its unsettled entries were returned), or it was reaped (after its in-flight entries
-- were reclaimed). docs/architecture.md, "Message groups".
--
-- KEYS[1] owners HASH, KEYS[2] parked ZSET, KEYS[3] held ZSET of the subscription's message
-- groups, KEYS[4] its returned ZSET
-- ARGV[1] the replica, ARGV[2] the address's notification channel
-- Entries parked for the replica join the returned ones (their order is the members'); a group
-- whose owner is now nobody goes to whichever replica's fetch meets it first. Returns the number
-- of groups dropped and entries moved, or -1 when the subscription has never seen a group.
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local prefix = ARGV[1] .. '|'
local dropped = 0
local held = redis.call('ZRANGEBYLEX', KEYS[3], '[' .. prefix, '[' .. prefix .. '\255')
for _, member in ipairs(held) do
  local g = string.sub(member, #prefix + 1)
  if redis.call('HGET', KEYS[1], g) == ARGV[1] then
    redis.call('HDEL', KEYS[1], g)
    dropped = dropped + 1
  end
  redis.call('ZREM', KEYS[3], member)
end
local parked = redis.call('ZRANGEBYLEX', KEYS[2], '[' .. prefix, '[' .. prefix .. '\255')
for _, full in ipairs(parked) do
  redis.call('ZADD', KEYS[4], 'NX', 0, string.sub(full, #prefix + 1))
  redis.call('ZREM', KEYS[2], full)
end
if dropped > 0 or #parked > 0 then redis.call('SPUBLISH', ARGV[2], ARGV[1]) end
return dropped + #parked
