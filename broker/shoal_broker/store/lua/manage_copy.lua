-- Copy messages onto one band of an address, each under a marker naming its source entry, so
-- that a move or retry run again after a crash copies nothing twice (the first step of a move;
-- manage_remove.lua on the source is the second, and the caller then forgets the markers).
--
-- KEYS[1] stream of the band written, KEYS[2] groups SET of the address,
-- KEYS[3..12] the STREAMs of bands 0..9 (the backlog counts them all),
-- KEYS[13] watchers HASH of the address, KEYS[14] markers HASH of the address (keys.py),
-- KEYS[15] levels SET of the address's bands in use (mark_band.lua)
-- ARGV[1] kind 'queue' or 'topic', ARGV[2] backlog limit in entries ('0' = none),
-- ARGV[3] the address's notification channel,
-- ARGV[4..] quintuples: marker ('<source>|<band>|<id>'), header, rest, expiry ms or '0',
--           origin or ''
-- The whole batch is refused when it would take the address over its limit, whatever the
-- address's overflow policy: a move never drops a message to make room.
-- Returns {copied, already copied}, or {-1} when a queue no longer exists, {-2} when the batch
-- would exceed the limit, {-3} when a topic has no subscription (the messages would be lost).
if redis.call('SCARD', KEYS[2]) == 0 then
  if ARGV[1] == 'topic' then return {-3} end
  return {-1}
end
local fresh = {}
local already = 0
for i = 4, #ARGV, 5 do
  if redis.call('HEXISTS', KEYS[14], ARGV[i]) == 1 then
    already = already + 1
  else
    fresh[#fresh + 1] = i
  end
end
--! include trim_consumed
--! include backlog_held
--! include mark_band
local limit = tonumber(ARGV[2])
if limit > 0 and #fresh > 0 then
  local held = backlog_held(3)
  if held + #fresh > limit then
    for b = 3, 12 do trim_consumed(KEYS[b]) end
    held = backlog_held(3)
    if held + #fresh > limit then return {-2} end
  end
end
--! include new_entry_fields
--! include notify_watchers
for _, i in ipairs(fresh) do
  local fields = new_entry_fields(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
  local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
  redis.call('HSET', KEYS[14], ARGV[i], id)
end
if #fresh > 0 then
  mark_band(KEYS[15], KEYS[1])
  notify_watchers(KEYS[13], ARGV[3], '')
end
return {#fresh, already}
