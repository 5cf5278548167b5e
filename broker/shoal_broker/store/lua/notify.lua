-- Wake the replicas with consumers of an address (see notify_watchers.lua): for what is not a
-- publish (returned entries, a commit, due scheduled messages); a publish does it in its script.
--
-- KEYS[1] watchers HASH replica id -> 1 (replicas subscribed to the address's channel)
-- ARGV[1] the address's notification channel, ARGV[2] this replica's id
-- Returns the number of replicas the notification reached (0 when none was sent).
--! include notify_watchers
return notify_watchers(KEYS[1], ARGV[1], ARGV[2])
