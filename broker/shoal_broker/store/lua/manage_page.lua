-- A page of one band of a subscription's messages not consumed yet, without consuming them
-- (the management API's browse, move and retry read through it).
--
-- KEYS[1] stream of the band, KEYS[2] returned ZSET of the group
-- ARGV[1] group, ARGV[2] band, ARGV[3] cursor: last id already read (exclusive, '0-0' = start),
-- ARGV[4] count: entries wanted, ARGV[5] scan bound: entries looked at, at most
-- An entry is not consumed yet when it was never delivered (after the group's last-delivered-id)
-- or is pending; a pending entry in the returned ZSET is ready again, any other pending one is
-- out at a consumer ('in-flight'). Acknowledged entries that trimming has not removed yet are
-- skipped.
-- Returns {new cursor, done ('1' when the band has nothing after the cursor),
-- id1, state1, header1, rest1, expiry1, origin1, id2, ...} with state 'ready', 'returned' or
-- 'in-flight'.
local want = tonumber(ARGV[4])
local bound = tonumber(ARGV[5])
local cursor = ARGV[3]
if redis.call('EXISTS', KEYS[1]) == 0 then return {cursor, '1'} end
local last = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
  if info['name'] == ARGV[1] then last = info['last-delivered-id'] end
end
if last == nil then return {cursor, '1'} end
--! include entry_fields
local function after(a, b)  -- stream id a > b
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local function pad(digits, width)
  return string.rep('0', width - #digits) .. digits
end
local out = {cursor, '0'}
local scanned = 0
local done = false
while want > 0 and scanned < bound do
  local batch = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', math.min(want, 500))
  if #batch == 0 then done = true break end
  for _, entry in ipairs(batch) do
    local id = entry[1]
    cursor = id
    scanned = scanned + 1
    local state = nil
    if after(id, last) then
      state = 'ready'
    elseif #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) > 0 then
      local ms, seq = string.match(id, '^(%d+)-(%d+)$')
      local member = ARGV[2] .. '|' .. pad(ms, 15) .. '-' .. pad(seq, 10)
      if redis.call('ZSCORE', KEYS[2], member) then state = 'returned' else state = 'in-flight' end
    end
    if state then
      local h, r, x, c, g = entry_fields(entry[2])
      if g ~= '' then c = c .. '\31' .. g end  -- as stored (routing/storage.stored_origin)
      out[#out + 1] = id
      out[#out + 1] = state
      out[#out + 1] = h
      out[#out + 1] = r
      out[#out + 1] = x
      out[#out + 1] = c
      want = want - 1
      if want == 0 then break end
    end
  end
end
if not done and want > 0 and scanned < bound then done = true end
if not done and #redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', 1) == 0 then
  done = true
end
out[1] = cursor
if done then out[2] = '1' end
return out
