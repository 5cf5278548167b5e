-- Wake the replicas with consumers of an address, unless this replica is the only one: a
-- replica's own consumers are woken in-process, and its own notification echoed back was 10-15 %
-- of its CPU per message at 1 000 msg/s (docs/benchmarks.md, sitting J).
--
-- KEYS[1] watchers HASH replica id -> 1 (replicas subscribed to the address's channel)
-- ARGV[1] the address's notification channel, ARGV[2] this replica's id
-- Returns the number of replicas the notification reached (0 when none was sent).
if redis.call('HLEN', KEYS[1]) > redis.call('HEXISTS', KEYS[1], ARGV[2]) then
  return redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return 0
