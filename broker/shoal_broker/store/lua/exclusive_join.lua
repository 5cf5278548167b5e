-- A consumer takes its place at the end of the line of an exclusive queue or subscription
-- (routing/exclusive.py): the first in line is the one consumer that receives, cluster-wide.
--
-- KEYS[1] line ZSET of the group (member -> attach time in µs, Redis's clock)
-- ARGV[1] member '<replica>|<connection>|<link>|<serial>'
-- Returns 1 when it is first in line (active), 0 when it waits behind others.
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], 'NX', tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[1])
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if head[1] == ARGV[1] then return 1 end
return 0
