-- What the consumer groups of one address have not consumed yet: read only (run as EVALSHA_RO).
--
-- KEYS[1..10] the address's streams (bands 0..9); KEYS[10 + i] group i's returned-entries ZSET
-- ARGV[i] group i's name
-- One call per address replaces a round trip per stream, group and question (inspect.py).
-- Returns per group {lag0, pending0, oldest0, ..., lag9, pending9, oldest9, returned,
-- length0, ..., length9, waiting}: lag -1 when Redis cannot tell it (deleted entries in range: the caller counts them),
-- oldest the id of the oldest unconsumed entry of that band ('' when none), length the band's
-- XLEN (the same in every row), waiting the returned entries not yet due after a redelivery
-- delay (score above now, on Redis's clock). A missing stream or group counts as 0.
local bands, lengths = {}, {}
for b = 1, 10 do
  local found = {}
  lengths[b] = redis.call('XLEN', KEYS[b])
  if lengths[b] > 0 then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[b])) do
      local info = {}
      for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
      found[info['name']] = info
    end
  end
  bands[b] = found
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, group in ipairs(ARGV) do
  local row = {}
  for b = 1, 10 do
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
    row[#row + 1] = lag
    row[#row + 1] = pending
    row[#row + 1] = oldest
  end
  row[#row + 1] = redis.call('ZCARD', KEYS[10 + i])
  for b = 1, 10 do row[#row + 1] = lengths[b] end
  row[#row + 1] = redis.call('ZCOUNT', KEYS[10 + i], '(' .. now, '+inf')
  out[i] = row
end
return out
