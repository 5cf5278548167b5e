-- Create an address (if new) and, for a queue, its consumer group, in one step: a replica that
-- sees the address must also find its group (else its first fetch fails with NOGROUP and a
-- publish is refused as "no longer exists").
--
-- KEYS[1] addresses HASH, KEYS[2] stream band 0, KEYS[3] stream band 1, KEYS[4] groups SET
-- ARGV[1] address, ARGV[2] kind wanted ('queue' or 'topic'), ARGV[3] the queue's group name
-- Returns the address's kind: the one wanted, or the kind it already had.
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
local kind = redis.call('HGET', KEYS[1], ARGV[1])
if kind == 'queue' then
  for i = 2, 3 do
    local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[i], ARGV[3], '0', 'MKSTREAM')
    if not ok and not string.find(tostring(err), 'BUSYGROUP') then
      return redis.error_reply(tostring(err))
    end
  end
  redis.call('SADD', KEYS[4], ARGV[3])
end
return kind
