-- Return entries a fetch brought while their consumer gave another one back (an exclusive
-- entity's, routing/exclusive.py): behind every returned entry, so behind the failed one that
-- waits out its redelivery delay, and ahead of the new ones. They share the last returned
-- entry's score (when it is due), and equal scores go in member order ('<band>|<padded id>'):
-- within a band, oldest first, as the stream had them.
--
-- KEYS[1] returned ZSET of the group
-- ARGV[1..n] members (keys.entry_member) of the entries returned; their delivery counts stay
-- Returns the score they were given (0: nothing else was returned, due at once).
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local score = tonumber(last[2] or '0')
for i = 1, #ARGV do redis.call('ZADD', KEYS[1], score, ARGV[i]) end
return score
