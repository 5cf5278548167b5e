-- Read entries of one band of a queue that are still available, without consuming them.
--
-- KEYS[1] stream of the band
-- ARGV[1] group (the queue's), ARGV[2] cursor: last id already shown (exclusive), ARGV[3] count
-- An entry is still available when it was never delivered (after the group's last-delivered-id)
-- or is pending (delivered but not yet acknowledged). Acknowledged entries that trimming has not
-- removed yet are skipped.
-- Returns {new cursor, id1, header1, rest1, expiry1, id2, ...}.
local want = tonumber(ARGV[3])
local cursor = ARGV[2]
if redis.call('EXISTS', KEYS[1]) == 0 then return {cursor} end
local last = '0-0'
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
  if info['name'] == ARGV[1] then last = info['last-delivered-id'] end
end
local function after(a, b)  -- stream id a > b
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local out = {cursor}
local scanned = 0
while want > 0 and scanned < 10000 do
  local batch = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', want)
  if #batch == 0 then break end
  for _, entry in ipairs(batch) do
    local id = entry[1]
    cursor = id
    scanned = scanned + 1
    local available = after(id, last)
      or #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) > 0
    if available and want > 0 then
      local h, r, x = '', '', '0'
      local fields = entry[2]
      for j = 1, #fields, 2 do
        local f = fields[j]
        if f == 'h' then h = fields[j + 1] elseif f == 'r' then r = fields[j + 1]
        elseif f == 'x' then x = fields[j + 1] end
      end
      out[#out + 1] = id
      out[#out + 1] = h
      out[#out + 1] = r
      out[#out + 1] = x
      want = want - 1
    end
  end
end
out[1] = cursor
return out
