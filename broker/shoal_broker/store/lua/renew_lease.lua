-- Renew this replica's lease, or notice it was lost.
--
-- KEYS[1] lease STRING of this replica, KEYS[2] its reaping lock STRING, KEYS[3] its joined STRING
-- (all three on the replica's own slot, keys.ReplicaKeys)
-- ARGV[1] this process's token, ARGV[2] lease length (ms), ARGV[3] this replica's id
-- Returns 'renewed'; 'late' (it had expired, but no replica has started reaping this one: it is
-- still joined and nobody holds its reaping lock, so what it holds is still
-- its own; the lease is taken again); 'lost' (it had expired and a reaper started or finished:
-- the lease is taken again, but what this replica held may have been returned); or 'taken'
-- (another process holds this replica id).
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 'renewed'
end
if holder then return 'taken' end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  return 'late'
end
return 'lost'
