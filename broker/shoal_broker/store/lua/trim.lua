-- Trim one band of an address below the oldest entry any subscription still needs, at most
-- ARGV[1] entries at a time.
--
-- KEYS[1] stream of the band, KEYS[2] levels SET of the address (mark_band.lua)
-- ARGV[1] limit: whole stream nodes are removed while they fit in it (XTRIM ~ LIMIT); only when
--         no whole node is left to remove is the rest of the consumed part (less than a node)
--         trimmed exactly. One exact XTRIM of a 100 000-entry backlog held Redis for 25 ms, every
--         replica's traffic with it (docs/performance.md#trimming); the caller calls again
--         while something was removed.
-- A band left empty leaves the levels SET: fetches stop reading it until it is written again.
-- Returns the number of entries removed.
--! include trim_consumed
local removed = 0
if redis.call('XLEN', KEYS[1]) > 0 then removed = trim_consumed(KEYS[1], tonumber(ARGV[1])) end
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], string.sub(KEYS[1], -1))
end
return removed
