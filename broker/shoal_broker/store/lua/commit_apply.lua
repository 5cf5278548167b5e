-- Apply one address's part of a cross-shard commit (store/commits.py), once: the record's key is
-- kept in the address's markers, so completing the commit again (its committer retrying, or the
-- reaper of a committer that died) applies nothing twice. A marker outlives its record by a grace
-- period (``commits.MARKER_GRACE_SECONDS``; the trimmer removes it then), so that even an apply
-- still on its way from a committer reaped meanwhile finds it.
--
-- KEYS[1] commit markers HASH of the address (record key -> ms when applied), KEYS[2..11] the
-- streams of bands 0..9, KEYS[12] groups SET, KEYS[13] watchers HASH (notify_watchers.lua),
-- KEYS[14..13+g] the delivery-count HASH of each acked group, in the order ARGV names the groups,
-- KEYS[14+g] the address's duplicate window ZSET (duplicate_window.lua), KEYS[15+g] the levels
-- SET of its bands in use (mark_band.lua)
-- ARGV[1] the commit record's key, ARGV[2] kind ('queue' or 'topic'), ARGV[3] the address's
-- notification channel ('' = none), ARGV[4] this replica's id, ARGV[5] sends: n, or
-- n:window:window-ms for an address with duplicate detection, ARGV[6] acked groups g,
-- ARGV[7 .. 6+g] the groups, then n quintuples band, header, rest, expiry ('0' = never), origin
-- (sextuples with the id last, '' = none, with detection); then acks as triples: group number
-- (1..g), band, entry id.
-- The sends are appended as publish.lua appends them: nothing is kept for a topic without
-- subscriptions, and nothing for a queue deleted meanwhile (its group is gone); with detection,
-- nothing for a send whose id the window holds (publish_unique.lua).
-- Returns {'already'} or {'applied', entries added, entries acknowledged, duplicates dropped}.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  -- written again all the same: a WAIT after it then confirms the first application too
  redis.call('HSET', KEYS[1], ARGV[1], redis.call('HGET', KEYS[1], ARGV[1]))
  return {'already'}
end
--! include notify_watchers
--! include new_entry_fields
--! include duplicate_window
--! include mark_band
local n, window, window_ms = string.match(ARGV[5], '^(%d+):(%d+):(%d+)$')
local sends, groups = tonumber(n or ARGV[5]), tonumber(ARGV[6])
local width = window and 6 or 5
local first = 7 + groups
local added, acked, duplicates = 0, 0, 0
if sends > 0 and redis.call('SCARD', KEYS[12]) > 0 then
  local ids, seen, now = KEYS[14 + groups], {}, 0
  if window then now = window_open(ids, tonumber(window_ms)) end
  for i = first, first + width * (sends - 1), width do
    local id = window and ARGV[i + 5] or ''
    if id == '' or not window_has(ids, id, seen) then
      if id ~= '' then seen[id] = true end
      local fields = new_entry_fields(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
      redis.call('XADD', KEYS[2 + tonumber(ARGV[i])], '*', unpack(fields))
      mark_band(KEYS[15 + groups], KEYS[2 + tonumber(ARGV[i])])
      added = added + 1
    else
      duplicates = duplicates + 1
    end
  end
  if window then window_add(ids, seen, now, tonumber(window), tonumber(window_ms)) end
end
for i = first + width * sends, #ARGV, 3 do
  local g, band, id = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
  local stream = KEYS[2 + tonumber(band)]
  -- a subscription deleted meanwhile has nothing left to acknowledge (XACK: NOGROUP)
  local ok, n = pcall(redis.call, 'XACK', stream, ARGV[6 + g], id)
  if ok then acked = acked + n end
  redis.call('HDEL', KEYS[13 + g], band .. '|' .. id)
end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000)))
if added > 0 and ARGV[3] ~= '' then notify_watchers(KEYS[13], ARGV[3], ARGV[4]) end
return {'applied', added, acked, duplicates}
