-- Delete a cross-shard commit's record and its index entry (store/commits.py): after every
-- address applied it, or to roll back one whose writing was in doubt (nothing was applied then).
--
-- KEYS[1] the record HASH, KEYS[2] the bucket's index SET (same slot)
-- ARGV[1] (rolling back only) milliseconds a tombstone stays in the record's place: a write of
--         the record still on its way (a reply that timed out) finds it and writes nothing
-- Returns the number of keys deleted (0: there was no record).
redis.call('SREM', KEYS[2], KEYS[1])
local deleted = redis.call('DEL', KEYS[1])
if ARGV[1] then
  redis.call('HSET', KEYS[1], 'void', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return deleted
