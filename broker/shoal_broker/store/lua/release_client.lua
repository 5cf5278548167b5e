-- Release a ClientID claim, but only the holder's own (a later connection may hold it now).
--
-- KEYS[1] clients HASH (ClientID -> holder)
-- ARGV[1] ClientID, ARGV[2] holder ('<replica>|<connection>')
-- Returns 1 when released, 0 when the claim was not this holder's.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
