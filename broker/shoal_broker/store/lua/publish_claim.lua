-- Append messages a consumer on this replica already has (sent ahead of the store,
-- amqp/subscriptions.py) to a queue's band, and claim them for this replica in the same step
-- together with whatever of the queue was still unread ahead of them.
--
-- KEYS[1] stream   STREAM of the band
-- KEYS[2] groups   SET subscription names of the address
-- KEYS[3] index    ZSET of the address's big messages, KEYS[4..] the bodies of the big ones among
--                  the messages (store/bodies.py), deleted when the messages are refused
-- ARGV[1] group    the queue's consumer group
-- ARGV[2] replica  this replica's id (its consumer in the group)
-- ARGV[3] band     the band KEYS[1] holds
-- ARGV[4..] quadruples, as publish.lua
-- They were sent because this replica had read everything of the queue, so anything unread ahead
-- of them is what other replicas appended since, within a notification's delay. A group reads in
-- order, so claiming them reads that too: it is returned and delivered after them. No
-- notification to other replicas: nothing appended here is left unread.
-- Returns -1 when the queue no longer exists; otherwise the number n of messages appended, their
-- n ids, then the entries read ahead of them as fetch.lua's octuples (band, id, header, rest,
-- expiry, delivery count, origin, message group); the caller gives those with a message group
-- back, for a fetch to hand them to their group's owner.
--! include append_entries
if redis.call('SCARD', KEYS[2]) == 0 then
  forget_bodies(4)
  return -1
end
--! include entry_fields
local ids = {}
append_entries(4, ids, KEYS[3])
local out = {#ids}
local ours = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  ours[id] = true
end
local last = ids[#ids]
local band = tonumber(ARGV[3])
local reached = false
while not reached do
  local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 500,
                         'STREAMS', KEYS[1], '>')
  if not res then break end
  for _, entry in ipairs(res[1][2]) do
    local id = entry[1]
    if id == last then reached = true end
    if not ours[id] then
      local h, r, x, c, g = entry_fields(entry[2])
      out[#out + 1] = band
      out[#out + 1] = id
      out[#out + 1] = h
      out[#out + 1] = r
      out[#out + 1] = x
      out[#out + 1] = '0'
      out[#out + 1] = c
      out[#out + 1] = g
    end
  end
end
return out
