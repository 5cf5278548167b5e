-- Included by notify.lua, publish.lua and publish_limited.lua (store/scripts.py): wake the
-- replicas with consumers of an address, unless this replica is the only one. A replica's own
-- consumers are woken in-process, and its own notification echoed back was 10-15 % of its CPU
-- per message at 1 000 msg/s (docs/performance.md#notifications).
-- watchers: HASH replica id -> 1 (replicas subscribed to the address's channel).
-- Returns the number of replicas the notification reached (0 when none was sent).
local function notify_watchers(watchers, channel, replica)
  if redis.call('HLEN', watchers) > redis.call('HEXISTS', watchers, replica) then
    return redis.call('SPUBLISH', channel, replica)
  end
  return 0
end
