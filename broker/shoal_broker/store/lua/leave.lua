-- A consumer leaves a named subscription; a volatile one goes with its last consumer.
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH, KEYS[3] subscription index SET
-- ARGV[1] consumer key, ARGV[2] subscription id
-- Returns {consumers left, topic of a deleted volatile subscription or ''}; the caller deletes
-- that topic's consumer group (its messages) when a topic is returned.
redis.call('HDEL', KEYS[2], ARGV[1])
--! include last_consumer
return last_consumer()
