-- Append messages to one band of an address, unless it is a topic nobody subscribes to.
--
-- KEYS[1] stream   STREAM of the band
-- KEYS[2] groups   SET subscription names of the address
-- ARGV[1] kind     'queue' or 'topic'
-- ARGV[2..] quadruples: header bytes, rest bytes, expiry (ms since epoch, '0' = never),
--           origin (the publishing connection's container-id, for no-local; '' = none)
-- Returns the number of entries added: 0 when a topic had no subscription (nothing kept: a
-- message published before a subscriber attached is never delivered to it), -1 when a queue no
-- longer exists (its group is gone: deleted meanwhile, e.g. a temporary queue).
if redis.call('SCARD', KEYS[2]) == 0 then
  if ARGV[1] == 'topic' then return 0 end
  return -1
end
--! include append_entries
return append_entries(2)
