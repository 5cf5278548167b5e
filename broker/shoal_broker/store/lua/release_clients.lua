-- Release every ClientID a dead replica's connections held.
--
-- KEYS[1] clients HASH (ClientID -> '<replica>|<connection>')
-- ARGV[1] dead replica id
-- Returns the number released.
local prefix = ARGV[1] .. '|'
local released = 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  if string.sub(fields[i + 1], 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[1], fields[i])
    released = released + 1
  end
end
return released
