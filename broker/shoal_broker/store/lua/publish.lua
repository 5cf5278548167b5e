-- Append messages to one band of an address, unless it is a topic nobody subscribes to.
--
-- KEYS[1] stream   STREAM of the band
-- KEYS[2] groups   SET subscription names of the address
-- ARGV[1] kind     'queue' or 'topic'
-- ARGV[2..] triples: header bytes, rest bytes, expiry (ms since epoch, '0' = never)
-- Returns the new entry ids, or an empty array when a topic had no subscription (nothing kept:
-- a message published before a subscriber attached is never delivered to it).
if ARGV[1] == 'topic' and redis.call('SCARD', KEYS[2]) == 0 then
  return {}
end
local ids = {}
for i = 2, #ARGV, 3 do
  if ARGV[i + 2] == '0' then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'h', ARGV[i], 'r', ARGV[i + 1])
  else
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'h', ARGV[i], 'r', ARGV[i + 1], 'x', ARGV[i + 2])
  end
end
return ids
