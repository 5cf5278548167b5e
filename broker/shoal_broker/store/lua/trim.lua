-- Trim one band of an address below the oldest entry any subscription still needs.
--
-- KEYS[1] stream of the band
-- Redis 7.0 cannot trim by acknowledgement, so this computes, over all consumer groups, the
-- oldest pending entry or (with nothing pending) the entry after last-delivered-id, and trims
-- with MINID. A stream without groups (a topic nobody subscribes to) keeps nothing.
-- Returns the number of entries removed.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then
  return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local min_ms, min_seq = nil, nil
for _, g in ipairs(groups) do
  local info = {}
  for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
  local ms, seq
  if tonumber(info['pending']) > 0 then
    local p = redis.call('XPENDING', KEYS[1], info['name'], '-', '+', 1)
    ms, seq = parse(p[1][1])
  else
    ms, seq = parse(info['last-delivered-id'])
    seq = seq + 1
  end
  if min_ms == nil or ms < min_ms or (ms == min_ms and seq < min_seq) then
    min_ms, min_seq = ms, seq
  end
end
return redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d-%d', min_ms, min_seq))
