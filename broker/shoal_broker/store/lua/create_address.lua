-- Create an address (if new) and, for a queue, its consumer group, in one step: a replica that
-- sees the address must also find its group (else its first fetch fails with NOGROUP and a
-- publish is refused as "no longer exists"). The address's record is its own meta HASH on its
-- slot; the caller writes the global index before and after (store/layout.py).
--
-- KEYS[1] meta HASH, KEYS[2..11] the streams of bands 0..9, KEYS[12] groups SET
-- ARGV[1] kind wanted ('queue' or 'topic'), ARGV[2] the queue's group name, ARGV[3] a new epoch
-- Returns {kind, epoch}: the ones given, or those the address already had.
redis.call('HSETNX', KEYS[1], 'kind', ARGV[1])
redis.call('HSETNX', KEYS[1], 'epoch', ARGV[3])
local meta = redis.call('HMGET', KEYS[1], 'kind', 'epoch')
if meta[1] == 'queue' then
  for i = 2, 11 do
    local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[i], ARGV[2], '0', 'MKSTREAM')
    if not ok and not string.find(tostring(err), 'BUSYGROUP') then
      return redis.error_reply(tostring(err))
    end
  end
  redis.call('SADD', KEYS[12], ARGV[2])
end
return meta
