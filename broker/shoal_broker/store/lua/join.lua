-- A consumer joins a named subscription, creating or recreating it as JMS requires.
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH
-- ARGV[1] consumer key, ARGV[2] replica id, ARGV[3] subscription id,
-- ARGV[4] shared '1'/'0', ARGV[5] durable '1'/'0', ARGV[6] scope, ARGV[7] client id, ARGV[8] name,
-- ARGV[9] topic, ARGV[10] selector ('' = none), ARGV[11] no_local '1'/'0',
-- ARGV[12] default max consumers (0 = unlimited; a provisioned max_consumers field wins),
-- ARGV[13] a new epoch (the definition's token, new with each creation: store/layout.py)
-- Returns {outcome, detail, epoch of the definition now}:
--   created         new subscription; detail ''
--   joined          existing subscription, same definition; detail = topic
--   recreated       topic, selector or noLocal differed and nobody was attached: the old one is
--                   replaced (its messages go); detail = the old topic, whose group must go too
--   locked          refused: in use with another definition, or exclusive and already consumed,
--                   or declared by a SharedSubscription resource (field ``owner``) that the
--                   attach contradicts: the resource is the source of truth and is never replaced
--   limit           refused: max consumers reached
local attached = redis.call('HLEN', KEYS[2])
local function define()
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'topic', ARGV[9], 'selector', ARGV[10], 'no_local', ARGV[11],
             'shared', ARGV[4], 'durable', ARGV[5], 'scope', ARGV[6], 'client', ARGV[7],
             'name', ARGV[8], 'epoch', ARGV[13])
end
local function reply(outcome, detail)
  -- a definition of the older layout gets its epoch here (store/layout.py lays them out)
  redis.call('HSETNX', KEYS[1], 'epoch', ARGV[13])
  return {outcome, detail, redis.call('HGET', KEYS[1], 'epoch')}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  define()
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  return reply('created', '')
end
local d = redis.call('HMGET', KEYS[1], 'topic', 'selector', 'no_local', 'shared', 'max_consumers',
                     'owner')
local differs = d[1] ~= ARGV[9] or d[2] ~= ARGV[10] or d[3] ~= ARGV[11]
if d[6] and (differs or d[4] ~= ARGV[4]) then
  return reply('locked', 'subscription is declared by SharedSubscription ' .. d[6] ..
          ' with another topic, selector, noLocal or sharing')
end
if differs then
  if attached > 0 then
    return reply('locked', 'subscription is in use with another topic, selector or noLocal')
  end
  local provisioned_max = d[5]
  define()
  if provisioned_max then redis.call('HSET', KEYS[1], 'max_consumers', provisioned_max) end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  return reply('recreated', d[1])
end
if d[4] ~= ARGV[4] then
  if attached > 0 then
    return reply('locked', 'subscription is in use as ' .. (d[4] == '1' and 'shared' or 'exclusive'))
  end
  redis.call('HSET', KEYS[1], 'shared', ARGV[4])
end
if ARGV[4] == '0' and attached > 0 then
  return reply('locked', 'the exclusive durable subscription already has an active consumer')
end
local max = tonumber(d[5] or ARGV[12])
if max > 0 and attached >= max then
  return reply('limit', 'the subscription has its maximum of ' .. max .. ' consumers')
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return reply('joined', d[1])
