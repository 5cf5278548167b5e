-- Included by trim.lua (store/scripts.py): the big messages (store/bodies.py) of a band whose
-- entries are no longer in its STREAM: those indexed below the stream's first entry (all of them
-- when it is empty); entries deleted inside the stream (a move, a last-value replacement, a
-- backlog limit's overflow) are found once the stream's head passes them. ``index`` ZSET
-- '<band>|<padded id>|<stub id>' (score 0); at most ``limit`` members. The caller deletes their
-- bodies, then the members (store/upkeep.py): a body's key is not known before, so a script
-- cannot declare it.
local function bodies_due(stream, band, index, limit)
  if redis.call('EXISTS', index) == 0 then return {} end
  local upto = '[' .. band .. '|~'
  local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
  if first then
    local ms, seq = string.match(first[1], '^(%d+)-(%d+)$')
    upto = string.format('(%d|%015d-%010d', band, tonumber(ms), tonumber(seq))
  end
  return redis.call('ZRANGEBYLEX', index, '[' .. band .. '|', upto, 'LIMIT', 0, limit)
end
