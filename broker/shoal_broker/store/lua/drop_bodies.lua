-- Included by trim.lua and publish_limited.lua (store/scripts.py): drop the bodies of big
-- messages (store/bodies.py) whose entries are no longer in the band's STREAM: those indexed
-- below the stream's first entry (all of them when it is empty). Entries deleted inside the
-- stream (a move, a last-value replacement) are dropped once the stream's head passes them.
-- ``index`` ZSET '<band>|<padded id>|<stub id>' (score 0), ``bodies`` HASH stub id -> body;
-- at most ``limit`` at a time. Returns how many were dropped.
local function drop_bodies(stream, band, index, bodies, limit)
  if redis.call('EXISTS', index) == 0 then return 0 end
  local upto = '[' .. band .. '|~'
  local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
  if first then
    local ms, seq = string.match(first[1], '^(%d+)-(%d+)$')
    upto = string.format('(%d|%015d-%010d', band, tonumber(ms), tonumber(seq))
  end
  local gone = redis.call('ZRANGEBYLEX', index, '[' .. band .. '|', upto, 'LIMIT', 0, limit)
  if #gone == 0 then return 0 end
  local ids = {}
  for i, member in ipairs(gone) do ids[i] = string.sub(member, 30) end
  redis.call('HDEL', bodies, unpack(ids))
  redis.call('ZREM', index, unpack(gone))
  return #gone
end
