-- Write a cross-shard commit's record and list it in its replica's bucket (store/commits.py): the
-- moment this is durable the transaction is committed.
--
-- KEYS[1] the record HASH, KEYS[2] the bucket's index SET (same slot)
-- ARGV field, value pairs of the record
-- Returns 1.
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('SADD', KEYS[2], KEYS[1])
return 1
