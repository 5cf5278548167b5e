-- Apply one address's part of a cross-shard commit (store/commits.py), once: the record's key is
-- kept in the address's markers, so completing the commit again (its committer retrying, or the
-- reaper of a committer that died) applies nothing twice. A marker outlives its record by a grace
-- period (``commits.MARKER_GRACE_SECONDS``; the trimmer removes it then), so that even an apply
-- still on its way from a committer reaped meanwhile finds it.
--
-- KEYS[1] commit markers HASH of the address (record key -> ms when applied), KEYS[2] stream
-- band 0, KEYS[3] stream band 1, KEYS[4] groups SET, KEYS[5] watchers HASH (notify_watchers.lua),
-- KEYS[6..] the delivery-count HASH of each acked group, in the order ARGV names the groups
-- ARGV[1] the commit record's key, ARGV[2] kind ('queue' or 'topic'), ARGV[3] the address's
-- notification channel ('' = none), ARGV[4] this replica's id, ARGV[5] sends n, ARGV[6] acked
-- groups g, ARGV[7 .. 6+g] the groups, then n quintuples band, header, rest, expiry ('0' =
-- never), origin; then acks as triples: group number (1..g), band, entry id.
-- The sends are appended as publish.lua appends them: nothing is kept for a topic without
-- subscriptions, and nothing for a queue deleted meanwhile (its group is gone).
-- Returns {'already'} or {'applied', entries added, entries acknowledged}.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  -- written again all the same: a WAIT after it then confirms the first application too
  redis.call('HSET', KEYS[1], ARGV[1], redis.call('HGET', KEYS[1], ARGV[1]))
  return {'already'}
end
--! include notify_watchers
--! include new_entry_fields
local sends, groups = tonumber(ARGV[5]), tonumber(ARGV[6])
local first = 7 + groups
local added, acked = 0, 0
if sends > 0 and redis.call('SCARD', KEYS[4]) > 0 then
  for i = first, first + 5 * (sends - 1), 5 do
    local fields = new_entry_fields(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
    redis.call('XADD', KEYS[2 + tonumber(ARGV[i])], '*', unpack(fields))
    added = added + 1
  end
end
for i = first + 5 * sends, #ARGV, 3 do
  local g, band, id = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
  local stream = KEYS[2 + tonumber(band)]
  -- a subscription deleted meanwhile has nothing left to acknowledge (XACK: NOGROUP)
  local ok, n = pcall(redis.call, 'XACK', stream, ARGV[6 + g], id)
  if ok then acked = acked + n end
  redis.call('HDEL', KEYS[5 + g], band .. '|' .. id)
end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000)))
if added > 0 and ARGV[3] ~= '' then notify_watchers(KEYS[5], ARGV[3], ARGV[4]) end
return {'applied', added, acked}
