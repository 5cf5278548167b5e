-- Remove messages of a queue that no consumer holds (the management API's delete, and the
-- second step of a move or retry, after manage_copy.lua put them on the target).
--
-- KEYS[1] stream of the band, KEYS[2] returned ZSET of the queue's group,
-- KEYS[3] delivery-count HASH of the group
-- ARGV[1] group, ARGV[2] band, ARGV[3..] entry ids
-- An entry out at a consumer (pending, not returned) is left: its consumer settles it. An entry
-- already consumed or gone counts as missing, so running this again removes nothing twice.
-- Returns {removed, in flight (left), missing}.
local last = nil
if redis.call('EXISTS', KEYS[1]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local info = {}
    for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
    if info['name'] == ARGV[1] then last = info['last-delivered-id'] end
  end
end
local function after(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local function pad(digits, width)
  return string.rep('0', width - #digits) .. digits
end
local removed, held, missing = 0, 0, 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if last == nil or ms == nil or #redis.call('XRANGE', KEYS[1], id, id) == 0 then
    missing = missing + 1
  elseif after(id, last) then
    redis.call('XDEL', KEYS[1], id)
    removed = removed + 1
  elseif #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) > 0 then
    local member = ARGV[2] .. '|' .. pad(ms, 15) .. '-' .. pad(seq, 10)
    if redis.call('ZREM', KEYS[2], member) == 1 then
      redis.call('XACK', KEYS[1], ARGV[1], id)
      redis.call('HDEL', KEYS[3], ARGV[2] .. '|' .. id)
      redis.call('XDEL', KEYS[1], id)
      removed = removed + 1
    else
      held = held + 1
    end
  else
    missing = missing + 1
  end
end
return {removed, held, missing}
