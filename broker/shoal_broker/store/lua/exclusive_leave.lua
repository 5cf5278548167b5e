-- A consumer leaves the line of an exclusive queue or subscription (routing/exclusive.py). When it
-- was the active one, everything its replica still holds of the group (entries fetched for it and
-- not delivered, or delivered and not settled) joins the returned entries, which any fetch serves
-- first, oldest first, before the next in line is woken: the next consumer starts where it stopped.
-- Its unsettled deliveries were returned already (delivery-count + 1) by the replica, ahead of
-- this script in the same pipeline; what is returned here keeps its count.
--
-- KEYS[1] line ZSET, KEYS[2..11] the streams of bands 0..9, KEYS[12] returned ZSET
-- ARGV[1] member, ARGV[2] group, ARGV[3] replica id (its consumer name in the group),
-- ARGV[4] the address's notification channel
-- Returns 1 when another consumer took over (a hand-over), else 0.
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 or head[1] ~= ARGV[1] then return 0 end
for band = 0, 9 do
  for _ = 1, 100 do  -- bounded: 100 pages of 100 entries
    local pending = redis.pcall('XPENDING', KEYS[band + 2], ARGV[2], '-', '+', 100, ARGV[3])
    if type(pending) ~= 'table' or pending.err or #pending == 0 then break end
    for _, p in ipairs(pending) do
      local ms, seq = string.match(p[1], '^(%d+)-(%d+)$')
      local member = string.format('%d|%015d-%010d', band, tonumber(ms), tonumber(seq))
      redis.call('XCLAIM', KEYS[band + 2], ARGV[2], 'reclaimed', 0, p[1], 'JUSTID')
      if not redis.call('ZSCORE', KEYS[12], member) then redis.call('ZADD', KEYS[12], 0, member) end
    end
  end
end
if redis.call('ZCARD', KEYS[1]) == 0 then return 0 end
redis.call('SPUBLISH', ARGV[4], 'exclusive')
return 1
