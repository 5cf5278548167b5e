-- Renew this replica's lease, or notice it was lost.
--
-- KEYS[1] lease STRING of this replica
-- ARGV[1] this process's token, ARGV[2] lease length (ms)
-- Returns 'renewed', 'lost' (it had expired: other replicas may have reaped us; the lease is
-- taken again), or 'taken' (another process holds this replica id).
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 'renewed'
end
if holder then return 'taken' end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 'lost'
