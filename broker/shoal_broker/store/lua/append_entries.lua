-- Included by publish.lua and publish_limited.lua (store/scripts.py): append the quadruples
-- ARGV[first..] (header, rest, expiry ms or '0', origin or '') to the STREAM KEYS[1]; returns
-- how many entries were added.
local function append_entries(first)
  local added = 0
  for i = first, #ARGV, 4 do
    local fields = {'h', ARGV[i], 'r', ARGV[i + 1]}
    if ARGV[i + 2] ~= '0' then
      fields[#fields + 1] = 'x'
      fields[#fields + 1] = ARGV[i + 2]
    end
    if ARGV[i + 3] ~= '' then
      fields[#fields + 1] = 'c'
      fields[#fields + 1] = ARGV[i + 3]
    end
    redis.call('XADD', KEYS[1], '*', unpack(fields))
    added = added + 1
  end
  return added
end
