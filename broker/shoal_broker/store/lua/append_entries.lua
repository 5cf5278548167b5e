-- Included by publish.lua, publish_limited.lua and publish_claim.lua (store/scripts.py): append
-- the quadruples ARGV[first..] (header, rest, expiry ms or '0', origin or '') to the STREAM
-- KEYS[1]; returns how many entries were added. With a table ``ids``, each new entry's id is
-- appended to it. A rest that is a big message's stub (byte 254, then its stub id: the body
-- waits under its own key, store/bodies.py) is indexed in the ZSET ``index``, so that a trim
-- finds the body of an entry it removed (bodies_due.lua).
--! include new_entry_fields
local function append_entries(first, ids, index)
  local added = 0
  for i = first, #ARGV, 4 do
    local fields = new_entry_fields(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
    if ids then ids[#ids + 1] = id end
    if string.byte(ARGV[i + 1], 1) == 254 then
      local ms, seq = string.match(id, '^(%d+)-(%d+)$')
      redis.call('ZADD', index, 0, string.format('%s|%015d-%010d|%s', string.sub(KEYS[1], -1),
                 tonumber(ms), tonumber(seq), string.sub(ARGV[i + 1], 2)))
    end
    added = added + 1
  end
  return added
end

-- The bodies of the quadruples' big messages (above), KEYS[first..], deleted: the script refused
-- them.
local function forget_bodies(first)
  if #KEYS >= first then redis.call('DEL', unpack(KEYS, first)) end
end
