-- Trim one band of an address below the oldest entry any subscription still needs, at most
-- ARGV[1] entries at a time.
--
-- KEYS[1] stream of the band, KEYS[2] levels SET of the address (mark_band.lua),
-- KEYS[3] index ZSET of the address's big messages (store/bodies.py), if given: the members of
-- entries no longer in the stream (bodies_due.lua) are returned after the count and the flag,
-- for the caller to delete their bodies, then them; they count as removed
-- ARGV[1] limit: whole stream nodes are removed while they fit in it (XTRIM ~ LIMIT); only when
--         no whole node is left to remove is the rest of the consumed part (less than a node)
--         trimmed exactly. One exact XTRIM of a 100 000-entry backlog held Redis for 25 ms, every
--         replica's traffic with it (docs/performance.md#trimming).
-- A band left empty leaves the levels SET: fetches stop reading it until it is written again.
-- Returns {removed, more, member...}: more = 1 when the limit stopped the call (entries or
-- members may be left), for the caller to call again; 0 when the band is trimmed.
--! include trim_consumed
--! include bodies_due
local limit = tonumber(ARGV[1])
local removed, more = 0, false
if redis.call('XLEN', KEYS[1]) > 0 then removed, more = trim_consumed(KEYS[1], limit) end
local due = {}
if KEYS[3] then
  due = bodies_due(KEYS[1], tonumber(string.sub(KEYS[1], -1)), KEYS[3], limit)
end
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], string.sub(KEYS[1], -1))
end
return {removed + #due, (more or #due >= limit) and 1 or 0, unpack(due)}
