-- Included by fetch.lua (store/scripts.py): routing/sharing.py's rule, on the record Redis keeps
-- of the replicas serving one subscription (HASH replica id -> 'consumers credit reserved
-- current fetched_ms reserved_ms'). tests/unit/test_sharing.py holds the two equal. Fields
-- that start with ``cursor`` are no replica's: their values go to ``cursors`` (band -> value).
local LAPSE_MS = 1000

local function share_records(key, cursor, cursors)
  local flat = redis.call('HGETALL', key)
  local shares, ids = {}, {}
  for i = 1, #flat, 2 do
    if cursor and string.sub(flat[i], 1, #cursor) == cursor then
      cursors[tonumber(string.sub(flat[i], #cursor + 1))] = flat[i + 1]
    end
    local k, w, t, cur, at, since = string.match(flat[i + 1],
      '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+)$')
    if k then
      shares[flat[i]] = {k = tonumber(k), w = tonumber(w), t = tonumber(t), cur = tonumber(cur),
                         at = tonumber(at), since = tonumber(since)}
      ids[#ids + 1] = flat[i]
    end
  end
  table.sort(ids)
  return shares, ids
end

local function share_encode(s)
  return string.format('%d %d %d %d %d %d', s.k, s.w, s.t, s.cur, s.at, s.since)
end

local function share_others(shares, me)
  for id, s in pairs(shares) do
    if id ~= me and s.k > 0 then return true end
  end
  return false
end

-- Whether every other replica's record shows nothing reserved and no free credit (or no
-- consumers): the rule then grants ``me`` min(its credit, what is available) and changes no
-- other record, so a fetch need not count what is available nor rewrite the others' records
-- (fetch.lua's fast path; routing/sharing.py, ``others_idle``).
local function share_others_idle(shares, me)
  for id, s in pairs(shares) do
    if id ~= me and (s.t ~= 0 or (s.k > 0 and s.w > 0)) then return false end
  end
  return true
end

local function share_reserve(s, count, now)
  if count <= 0 then return end
  if s.t == 0 then s.since = now end
  s.t = s.t + count
end

-- How many of ``available`` entries ``me`` may take; ``shares`` and ``ids`` updated in place.
local function share_grant(shares, ids, me, consumers, credit, available, now)
  local mine = shares[me]
  local new = mine == nil
  if new then
    mine = {k = 0, w = 0, t = 0, cur = 0, at = 0, since = 0}
    shares[me] = mine
    ids[#ids + 1] = me
    table.sort(ids)
  end
  if not share_others(shares, me) then
    if new then mine.k, mine.w, mine.at = consumers, credit, now end
    return credit
  end
  mine.k, mine.w, mine.at = consumers, credit, now
  for _, id in ipairs(ids) do
    local s = shares[id]
    if id ~= me and s.t > 0 and now - s.since > LAPSE_MS and now - s.at > LAPSE_MS then
      s.t, s.w = 0, 0
    end
  end
  local left = math.max(available, 0)
  mine.t = math.min(mine.t, left)
  left = left - mine.t
  for _, id in ipairs(ids) do
    if id ~= me then
      local s = shares[id]
      s.t = math.min(s.t, left)
      left = left - s.t
    end
  end
  local weighted, total = {}, 0
  for _, id in ipairs(ids) do
    local s = shares[id]
    if s.k > 0 and s.w > 0 then
      weighted[#weighted + 1] = s
      total = total + s.w
    end
  end
  if left > 0 and total > 0 then
    local given = 0
    for _, s in ipairs(weighted) do
      local part = math.floor(left * s.w / total)
      share_reserve(s, part, now)
      given = given + part
    end
    for _ = 1, left - given do
      local chosen = nil
      for _, s in ipairs(weighted) do
        s.cur = s.cur + s.w
        if chosen == nil or s.cur > chosen.cur then chosen = s end
      end
      chosen.cur = chosen.cur - total
      share_reserve(chosen, 1, now)
    end
  end
  local granted = math.min(credit, mine.t)
  mine.t = 0
  mine.w = credit - granted
  return granted
end
