-- What the consumer groups of one address have not consumed yet: read only (run as EVALSHA_RO).
--
-- KEYS[1..10] the address's streams (bands 0..9), KEYS[11] its levels SET (mark_band.lua);
-- KEYS[11 + i] group i's returned-entries ZSET
-- ARGV[i] group i's name
-- One call per address replaces a round trip per stream, group and question (inspect.py). Only
-- the bands that can hold entries are read: the default one (5) and those in the levels SET, so
-- an idle address used at one priority costs one XLEN, not ten.
-- Returns per group {returned, waiting, then for each band holding entries: band, lag, pending,
-- oldest, length}: lag -1 when Redis cannot tell it (deleted entries in range: the caller counts
-- them), oldest the id of the oldest unconsumed entry of that band ('' when none), length the
-- band's XLEN (the same in every row), waiting the returned entries not yet due after a
-- redelivery delay (score above now, on Redis's clock). A missing group counts as 0; a band left
-- out holds nothing.
local used = {6}
for _, band in ipairs(redis.call('SMEMBERS', KEYS[11])) do
  if band ~= '5' then used[#used + 1] = tonumber(band) + 1 end
end
table.sort(used)
local bands, lengths, held = {}, {}, {}
for _, b in ipairs(used) do
  local length = redis.call('XLEN', KEYS[b])
  if length > 0 then
    local found = {}
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[b])) do
      local info = {}
      for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
      found[info['name']] = info
    end
    held[#held + 1] = b
    bands[b] = found
    lengths[b] = length
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, group in ipairs(ARGV) do
  local row = {redis.call('ZCARD', KEYS[11 + i]), redis.call('ZCOUNT', KEYS[11 + i], '(' .. now, '+inf')}
  for _, b in ipairs(held) do
    local info = bands[b][group]
    local lag, pending, oldest = 0, 0, ''
    if info then
      pending = tonumber(info['pending']) or 0
      lag = info['lag'] and tonumber(info['lag']) or -1
      if pending > 0 then
        local summary = redis.call('XPENDING', KEYS[b], group)
        oldest = summary[2] or ''
      elseif lag ~= 0 then
        local first = redis.call('XRANGE', KEYS[b], '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
        if first[1] then oldest = first[1][1] end
      end
    end
    row[#row + 1] = b - 1
    row[#row + 1] = lag
    row[#row + 1] = pending
    row[#row + 1] = oldest
    row[#row + 1] = lengths[b]
  end
  out[i] = row
end
return out
