-- Declare a shared subscription from a SharedSubscription resource (the operator's one write).
--
-- KEYS[1] definition HASH, KEYS[2] consumers HASH (the indexes are written by the caller:
-- store/layout.py)
-- ARGV[1] subscription id, ARGV[2] name, ARGV[3] scope, ARGV[4] client id, ARGV[5] durable '1'/'0',
-- ARGV[6] topic, ARGV[7] selector ('' = none), ARGV[8] max consumers ('' = broker default),
-- ARGV[9] owner '<namespace>/<name>', ARGV[10] generation, ARGV[11] recreate '1'/'0',
-- ARGV[12] a new epoch (used when the definition is created)
-- Returns {outcome, detail, epoch of the definition}:
--   created     new; detail ''
--   adopted     an app had created the same subscription; now declared; detail ''
--   updated     same subscription, a limit or the generation changed; detail ''
--   unchanged   nothing to write; detail ''
--   recreated   topic or selector differed and recreate was allowed with nobody attached: the old
--               backlog goes; detail = the old topic, whose consumer group the caller deletes
--   conflict    refused; detail says why (another owner, in use, or a change without recreate)
local function define()
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'topic', ARGV[6], 'selector', ARGV[7], 'no_local', '0',
             'shared', '1', 'durable', ARGV[5], 'scope', ARGV[3], 'client', ARGV[4],
             'name', ARGV[2], 'epoch', ARGV[12])
end
local function own()
  redis.call('HSET', KEYS[1], 'owner', ARGV[9], 'generation', ARGV[10])
  if ARGV[8] == '' then redis.call('HDEL', KEYS[1], 'max_consumers')
  else redis.call('HSET', KEYS[1], 'max_consumers', ARGV[8]) end
end
local function reply(outcome, detail)
  redis.call('HSETNX', KEYS[1], 'epoch', ARGV[12])  -- a definition of the older layout
  return {outcome, detail, redis.call('HGET', KEYS[1], 'epoch')}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  define()
  own()
  return reply('created', '')
end
local d = redis.call('HMGET', KEYS[1], 'topic', 'selector', 'no_local', 'shared', 'owner',
                     'generation', 'max_consumers')
if d[5] and d[5] ~= ARGV[9] then
  return reply('conflict', 'already declared by ' .. d[5])
end
local attached = redis.call('HLEN', KEYS[2])
if d[1] ~= ARGV[6] or d[2] ~= ARGV[7] or d[3] ~= '0' then
  if ARGV[11] ~= '1' then
    return reply('conflict', 'exists with topic ' .. tostring(d[1]) .. ' and selector "' ..
                 tostring(d[2]) .. '"; set selectorChangePolicy=Recreate to replace it')
  end
  if attached > 0 then
    return reply('conflict', 'the change waits until its ' .. attached .. ' consumer(s) detach')
  end
  define()
  own()
  return reply('recreated', d[1])
end
if d[4] ~= '1' then
  if attached > 0 then
    return reply('conflict', 'in use as an exclusive durable subscription')
  end
  redis.call('HSET', KEYS[1], 'shared', '1')
end
local outcome = 'unchanged'
if not d[5] then outcome = 'adopted'
elseif d[6] ~= ARGV[10] or (d[7] or '') ~= ARGV[8] then outcome = 'updated' end
own()
return reply(outcome, '')
