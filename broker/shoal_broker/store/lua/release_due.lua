-- Move scheduled messages whose time has come into the address's streams.
--
-- KEYS[1] scheduled ZSET, KEYS[2] scheduled HASH (fields as in schedule.lua),
-- KEYS[3..12] the streams of bands 0..9, KEYS[13] groups SET, KEYS[14] levels SET (mark_band.lua)
-- ARGV[1] now (ms), ARGV[2] at most this many, ARGV[3] address kind ('queue' or 'topic')
-- A topic with no subscription when the message falls due keeps nothing (as at publish time).
-- Each member is removed by the same script that appends it, so replicas moving the same
-- address concurrently never duplicate a message. Returns the number moved.
--! include mark_band
--! include new_entry_fields
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local keep = not (ARGV[3] == 'topic' and redis.call('SCARD', KEYS[13]) == 0)
for _, m in ipairs(due) do
  local f = {m .. '|b', m .. '|h', m .. '|r', m .. '|x', m .. '|c'}
  local v = redis.call('HMGET', KEYS[2], unpack(f))
  if v[1] and keep then
    local fields = new_entry_fields(v[2], v[3], v[4], v[5])  -- the origin carries any group
    redis.call('XADD', KEYS[3 + tonumber(v[1])], '*', unpack(fields))
    mark_band(KEYS[14], KEYS[3 + tonumber(v[1])])
  end
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], unpack(f))
end
return #due
