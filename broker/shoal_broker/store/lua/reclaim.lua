-- Return a dead replica's in-flight entries of one subscription on one band to the subscription.
--
-- KEYS[1] stream of the band, KEYS[2] returned ZSET of the group, KEYS[3] delivery-count HASH,
-- KEYS[4] (optional) the group's message-group parked ZSET: an entry parked for the dead replica
-- (claimed for it, never sent) joins the returned set without counting an attempt
-- ARGV[1] group, ARGV[2] dead consumer (replica id), ARGV[3] band, ARGV[4] at most this many,
-- ARGV[5] '1' to count the attempt as failed (a crash), '0' not to (a clean exit),
-- ARGV[6] redelivery delay (ms, 0 = none), ARGV[7] its multiplier, ARGV[8] its maximum (ms):
-- a failed attempt waits delay * multiplier ^ (count - 1), at most the maximum
-- (routing/redelivery.py)
-- Each entry the dead replica held is claimed by the pseudo-consumer 'reclaimed' (so a second
-- reaper finds nothing left to count), its failed-attempt count goes up by one (it may have been
-- seen: AMQP's delivery-count rule for an unsettled delivery whose link is gone), and it joins the
-- returned set any replica's fetch serves first. Entries already returned keep their count.
-- Returns the number of entries moved; call again while it returns ARGV[4].
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[4]), ARGV[2])
local moved = 0
local delay = tonumber(ARGV[6] or '0')
local now = 0
if delay > 0 and ARGV[5] == '1' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
for _, p in ipairs(pending) do
  local id = p[1]
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  local member = string.format('%s|%015d-%010d', ARGV[3], tonumber(ms), tonumber(seq))
  redis.call('XCLAIM', KEYS[1], ARGV[1], 'reclaimed', 0, id, 'JUSTID')
  local parked = KEYS[4] and redis.call('ZREM', KEYS[4], ARGV[2] .. '|' .. member) == 1
  if parked then
    redis.call('ZADD', KEYS[2], 'NX', 0, member)
  elseif not redis.call('ZSCORE', KEYS[2], member) then
    local due = 0
    if ARGV[5] == '1' then
      local count = redis.call('HINCRBY', KEYS[3], ARGV[3] .. '|' .. id, 1)
      if now > 0 then
        local wait = delay * tonumber(ARGV[7]) ^ (count - 1)
        due = now + math.floor(math.min(wait, tonumber(ARGV[8])))
      end
    end
    redis.call('ZADD', KEYS[2], due, member)
  end
  moved = moved + 1
end
return moved
