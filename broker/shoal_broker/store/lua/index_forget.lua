-- Remove a name from a global index (a HASH name -> value) only if it still holds the value the
-- deleting caller saw (docs/redis-modes.md, "Indexes outside the scripts"): a creation that
-- started meanwhile wrote its own epoch there, and keeps its entry.
--
-- KEYS[1] the index HASH
-- ARGV[1] the name, ARGV[2] the value it had when its entity was deleted
-- Returns 1 when removed, 0 when the index holds something else (or nothing) for the name.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
