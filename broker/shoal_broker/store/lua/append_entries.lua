-- Included by publish.lua, publish_limited.lua and publish_claim.lua (store/scripts.py): append
-- the quadruples ARGV[first..] (header, rest, expiry ms or '0', origin or '') to the STREAM
-- KEYS[1]; returns how many entries were added. With a table ``ids``, each new entry's id is
-- appended to it.
--! include new_entry_fields
local function append_entries(first, ids)
  local added = 0
  for i = first, #ARGV, 4 do
    local fields = new_entry_fields(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
    if ids then ids[#ids + 1] = id end
    added = added + 1
  end
  return added
end
