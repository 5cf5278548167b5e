-- Included by the scripts that append entries (store/scripts.py): a band other than the default
-- one (5: priority 4) joins the address's levels SET (keys.AddressKeys.levels), the bands
-- fetch.lua reads besides the default one. ``stream`` is the band's key (``...:p:<band>``).
local function mark_band(levels, stream)
  local band = string.sub(stream, -1)
  if band ~= '5' then redis.call('SADD', levels, band) end
end
