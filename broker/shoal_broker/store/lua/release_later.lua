-- Return an entry to its subscription, deliverable again only after a redelivery delay
-- (routing/redelivery.py); due on Redis's clock, which fetch.lua reads too.
--
-- KEYS[1] returned ZSET of the group (score: when due, ms), KEYS[2] delivery-count HASH
-- ARGV[1] member (keys.entry_member), ARGV[2] count field (keys.entry_field),
-- ARGV[3] '1' to count a failed attempt, ARGV[4] the delay (ms)
-- Returns the due time.
if ARGV[3] == '1' then redis.call('HINCRBY', KEYS[2], ARGV[2], 1) end
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], due, ARGV[1])
return due
