-- Included by trim.lua and publish_limited.lua (store/scripts.py): remove from a STREAM the
-- entries every consumer group of it has consumed; returns how many were removed, and whether
-- more may be left to remove. With a ``limit``, whole nodes go first, at most ``limit`` entries
-- (trim.lua); when they stop short of the limit by a node's room or more, no whole node is left
-- below the threshold, and the rest (less than a node) goes exactly in the same call.
-- Redis 7.0 cannot trim by acknowledgement, so this computes, over all consumer groups, the
-- oldest pending entry or (with nothing pending) the entry after last-delivered-id, and trims
-- with MINID. A stream without groups (a topic nobody subscribes to) keeps nothing.
local function trim_consumed(stream, limit)
  -- whole nodes first while there are any (with a limit), then exactly. A node holds at most
  -- NODE_ENTRIES (Redis's stream-node-max-entries, default 100): a whole-node trim that removed
  -- no more than limit - NODE_ENTRIES stopped at the threshold, not at the limit
  local NODE_ENTRIES = 100
  local function xtrim(strategy, threshold)
    local removed = 0
    if limit then
      removed = redis.call('XTRIM', stream, strategy, '~', threshold, 'LIMIT', limit)
      if removed > limit - NODE_ENTRIES then return removed, true end
    end
    return removed + redis.call('XTRIM', stream, strategy, threshold), false
  end
  if redis.call('EXISTS', stream) == 0 then return 0, false end
  local groups = redis.call('XINFO', 'GROUPS', stream)
  if #groups == 0 then return xtrim('MAXLEN', 0) end
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
      local p = redis.call('XPENDING', stream, info['name'], '-', '+', 1)
      ms, seq = parse(p[1][1])
    else
      ms, seq = parse(info['last-delivered-id'])
      seq = seq + 1
    end
    if min_ms == nil or ms < min_ms or (ms == min_ms and seq < min_seq) then
      min_ms, min_seq = ms, seq
    end
  end
  return xtrim('MINID', string.format('%d-%d', min_ms, min_seq))
end
