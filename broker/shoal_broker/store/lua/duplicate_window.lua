-- Included by publish_unique.lua and commit_apply.lua (store/scripts.py): an address's duplicate
-- window, a ZSET id -> ms when the message with that id was stored (keys.AddressKeys.duplicates).
-- Bounded twice: ids older than the window's time are forgotten before each check, and past its
-- count the oldest ones after each addition; the key itself expires a window's time after the
-- last addition. The time is Redis's own (TIME): every broker replica measures by one clock.

-- Forget the ids stored more than ``window_ms`` ago; returns now in ms.
local function window_open(ids, window_ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', ids, '-inf', '(' .. string.format('%d', now - window_ms))
  return now
end

-- Whether ``id`` was stored within the window, or earlier in the same call (``seen``).
local function window_has(ids, id, seen)
  if seen[id] then return true end
  return redis.call('ZSCORE', ids, id) ~= false
end

-- Remember the ids of ``seen`` as stored now, then keep the newest ``count``; the whole window
-- goes once nothing was stored for ``window_ms`` (an address no longer published to).
local function window_add(ids, seen, now, count, window_ms)
  local score, added = string.format('%d', now), false
  for id in pairs(seen) do
    redis.call('ZADD', ids, score, id)
    added = true
  end
  if not added then return end
  local excess = redis.call('ZCARD', ids) - count
  if excess > 0 then redis.call('ZREMRANGEBYRANK', ids, 0, excess - 1) end
  redis.call('PEXPIRE', ids, window_ms)
end
