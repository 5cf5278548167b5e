-- Return a dead replica's in-flight entries of one subscription on one band to the subscription.
--
-- KEYS[1] stream of the band, KEYS[2] returned ZSET of the group, KEYS[3] delivery-count HASH
-- ARGV[1] group, ARGV[2] dead consumer (replica id), ARGV[3] band, ARGV[4] at most this many,
-- ARGV[5] '1' to count the attempt as failed (a crash), '0' not to (a clean exit)
-- Each entry the dead replica held is claimed by the pseudo-consumer 'reclaimed' (so a second
-- reaper finds nothing left to count), its failed-attempt count goes up by one (it may have been
-- seen: AMQP's delivery-count rule for an unsettled delivery whose link is gone), and it joins the
-- returned set any replica's fetch serves first. Entries already returned keep their count.
-- Returns the number of entries moved; call again while it returns ARGV[4].
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[4]), ARGV[2])
local moved = 0
for _, p in ipairs(pending) do
  local id = p[1]
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  local member = string.format('%s|%015d-%010d', ARGV[3], tonumber(ms), tonumber(seq))
  redis.call('XCLAIM', KEYS[1], ARGV[1], 'reclaimed', 0, id, 'JUSTID')
  if not redis.call('ZSCORE', KEYS[2], member) then
    if ARGV[5] == '1' then redis.call('HINCRBY', KEYS[3], ARGV[3] .. '|' .. id, 1) end
    redis.call('ZADD', KEYS[2], 0, member)
  end
  moved = moved + 1
end
return moved
