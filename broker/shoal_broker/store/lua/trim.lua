-- Trim one band of an address below the oldest entry any subscription still needs.
--
-- KEYS[1] stream of the band
-- Returns the number of entries removed.
--! include trim_consumed
return trim_consumed(KEYS[1])
