-- Hold a message until its delivery time (JMS delivery delay, x-opt-delivery-time).
--
-- KEYS[1] scheduled ZSET (member -> due time, ms since epoch)
-- KEYS[2] scheduled HASH: '<member>|b' band, '<member>|h' header, '<member>|r' rest,
--         '<member>|x' expiry (ms, '0' = never), '<member>|c' origin container-id
-- ARGV[1] due time (ms), ARGV[2] member (unique), ARGV[3] band, ARGV[4] header, ARGV[5] rest,
-- ARGV[6] expiry, ARGV[7] origin
-- Returns 1.
local m = ARGV[2]
redis.call('HSET', KEYS[2], m .. '|b', ARGV[3], m .. '|h', ARGV[4], m .. '|r', ARGV[5],
           m .. '|x', ARGV[6], m .. '|c', ARGV[7])
redis.call('ZADD', KEYS[1], tonumber(ARGV[1]), m)
return 1
