-- Included by publish_limited.lua, publish_unique.lua and publish_last.lua (store/scripts.py):
-- overflow DropOldest makes room by trimming ``excess`` entries from the oldest end of the
-- address's streams KEYS[first..first + 9] (bands 0..9), lowest priority (band 9) first.
local function drop_oldest(first, excess)
  for band = first + 9, first, -1 do
    if excess <= 0 then return end
    local length = redis.call('XLEN', KEYS[band])
    local cut = math.min(length, excess)
    if cut > 0 then
      redis.call('XTRIM', KEYS[band], 'MAXLEN', length - cut)
      excess = excess - cut
    end
  end
end
