-- Delete a cross-shard commit's record and its index entry (store/commits.py): after every
-- address applied it, or to roll back one whose writing was in doubt (nothing was applied then).
--
-- KEYS[1] the record HASH, KEYS[2] the bucket's index SET (same slot)
-- Returns the number of keys deleted (0: there was no record).
redis.call('SREM', KEYS[2], KEYS[1])
return redis.call('DEL', KEYS[1])
