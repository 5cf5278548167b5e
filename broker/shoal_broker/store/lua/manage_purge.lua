-- Purge a queue or subscription: every message no consumer holds is consumed at once.
--
-- KEYS[1..10] the STREAMs of bands 0..9, KEYS[11] returned ZSET of the group,
-- KEYS[12] delivery-count HASH of the group
-- ARGV[1] group
-- The group's last-delivered id moves to the end of each stream (what was never delivered is
-- consumed; the periodic trim removes what every group consumed) and returned entries are
-- acknowledged. Entries out at a consumer stay, for their consumer to settle.
-- Returns {purged, in flight (left)}.
local purged, held = 0, 0
for band = 0, 9 do
  local stream = KEYS[band + 1]
  if redis.call('EXISTS', stream) == 1 then
    local last, lag = nil, nil
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local info = {}
      for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
      if info['name'] == ARGV[1] then last, lag = info['last-delivered-id'], info['lag'] end
    end
    if last then
      if not lag then
        lag = 0
        local cursor = last
        while true do
          local batch = redis.call('XRANGE', stream, '(' .. cursor, '+', 'COUNT', 1000)
          if #batch == 0 then break end
          lag = lag + #batch
          cursor = batch[#batch][1]
        end
      end
      purged = purged + lag
      redis.call('XGROUP', 'SETID', stream, ARGV[1], '$')
      held = held + redis.call('XPENDING', stream, ARGV[1])[1]
    end
  end
end
local returned = redis.call('ZRANGE', KEYS[11], 0, -1)
for _, member in ipairs(returned) do
  local band, ms, seq = string.match(member, '^(%d)|(%d+)-(%d+)$')
  local id = (string.match(ms, '^0*(%d-%d)$')) .. '-' .. (string.match(seq, '^0*(%d-%d)$'))
  local acked = redis.call('XACK', KEYS[tonumber(band) + 1], ARGV[1], id)
  redis.call('HDEL', KEYS[12], band .. '|' .. id)
  purged = purged + acked
  held = held - acked
end
redis.call('DEL', KEYS[11])
return {purged, held}
