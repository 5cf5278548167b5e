-- A consumer leaves a named subscription; a volatile one goes with its last consumer.
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH
-- ARGV[1] consumer key, ARGV[2] subscription id
-- Returns {consumers left, topic of a deleted volatile subscription or '', its epoch or ''}; the
-- caller deletes that topic's consumer group (its messages) when a topic is returned, and takes
-- the subscription out of the index while it names that epoch.
redis.call('HDEL', KEYS[2], ARGV[1])
--! include last_consumer
return last_consumer()
