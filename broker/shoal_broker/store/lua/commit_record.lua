-- Write a cross-shard commit's record and list it in its replica's bucket (store/commits.py): the
-- moment this is durable the transaction is committed.
--
-- KEYS[1] the record HASH, KEYS[2] the bucket's index SET (same slot)
-- ARGV field, value pairs of the record
-- Returns 1, or 0 when the key exists already: a record rolled back while this write was still on
-- its way leaves a tombstone there (commit_forget.lua), and a late write must not undo that.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('SADD', KEYS[2], KEYS[1])
return 1
