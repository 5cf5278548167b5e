-- Take a dead (or departed) replica's consumers out of the line of an exclusive queue or
-- subscription (routing/exclusive.py). The reaper has returned that replica's entries first
-- (reclaim.lua), so the next in line starts with them.
--
-- KEYS[1] line ZSET
-- ARGV[1] replica id, ARGV[2] the address's notification channel
-- Returns 1 when the active consumer was the replica's and another took over, else 0.
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if #head == 0 then return 0 end
local prefix = ARGV[1] .. '|'
local gone = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(member, 1, #prefix) == prefix then gone[#gone + 1] = member end
end
if #gone == 0 then return 0 end
redis.call('ZREM', KEYS[1], unpack(gone))
local now = redis.call('ZRANGE', KEYS[1], 0, 0)
if #now == 0 or now[1] == head[1] then return 0 end
redis.call('SPUBLISH', ARGV[2], 'exclusive')
return 1
