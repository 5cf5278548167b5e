-- Hand up to ARGV[3] entries of a subscription to one replica (the consumer ARGV[2]), or its
-- share of them when other replicas serve the subscription too (share.lua, routing/sharing.py).
--
-- KEYS[1..10] the streams of bands 0..9 (band = 9 - JMS priority; band 5: priority 4),
-- KEYS[11] returned ZSET of the group, KEYS[12] delivery-count HASH of the group,
-- KEYS[13] shares HASH of the group (replica id -> its record, share.lua),
-- KEYS[14] levels SET of the address: the bands besides 5 written and not trimmed empty since
--          (mark_band.lua); only those and band 5 are read, so an address used at one
--          priority costs one SMEMBERS of an empty SET, not a read per band
-- ARGV[1] group, ARGV[2] consumer (replica id), ARGV[3] count (at most),
-- ARGV[4] '1': read the default band (5) here too; '0': leave it to the plain XREADGROUP the
--         caller sends right after this script (an entry handed back through Lua costs Redis
--         ~3 µs more than one read directly, docs/performance.md#bulk-fetch; when this script
--         hands out anything but new band-5 entries, the caller gives what that read took back
--         behind them). A lower band in use (6..9) holding entries makes the script read band 5
--         itself all the same, ahead of them.
-- ARGV[5] consumers of the subscription on this replica; 0 for a group only this replica ever
--         reads (a plain topic subscriber's): no record, no sharing
-- ARGV[6] the free credit of those consumers (its weight in the sharing; may exceed the count)
-- ARGV[7] the address's notification channel: a replica that joins the sharing wakes the others,
--         so they see it before they next take everything (hand-over, sending ahead)
-- KEYS[15] message groups' owners HASH of the group, KEYS[16] their parked ZSET, KEYS[17] their
--         held ZSET (keys.py; docs/architecture.md, "Message groups"): an entry with a message
--         group (field g) goes out here only if this replica owns the group, or nobody does (it
--         takes it); one owned by another replica is claimed for that replica and parked for it,
--         and that replica's fetch takes what is parked for it with its returned entries, in
--         member order, so a group's entries go out in the order of the subscription
-- KEYS[18] and ARGV[8], only for an exclusive queue or subscription (routing/exclusive.py): its
--         line ZSET and the member of the consumer this replica fetches for; unless that member
--         is first in line, nothing is fetched and the reply is {0, -2, the first member or ''}
--         (ARGV[5] is 0 then: no sharing); while a returned entry waits out a redelivery
--         delay, nothing is fetched either (the reply says when it is due): order is kept
-- Bands are served in order, 0 (priority 9) first; within a band, returned (released or failed)
-- entries come first, oldest first, claimed from whichever replica held them, then new ones.
-- The returned entries looked at are the first ARGV[3] of the ZSET, whose members
-- ('<band>|<padded id>') sort by band when due at once (score 0). A returned entry waiting out
-- a redelivery delay (its score: when it is due, ms on Redis's clock) stays, and the entries
-- behind it flow past.
-- Returns how many entries it handed out other than new band-5 ones; how many entries it left
-- for other replicas (-1: this replica serves the subscription alone; on the sharing's fast path,
-- 0 when the read took the whole count up to the credit: the caller fetches again after a full
-- fetch, so what lies past it is not counted); in how many ms the first
-- delayed entry is due (0: none waits; 1 also when the entries read were all parked for other
-- replicas up to the bound: look again); then a flat array of octuples:
-- band, id, header, rest, expiry, delivery count, origin, message group.
if ARGV[8] then
  local first = redis.call('ZRANGE', KEYS[18], 0, 0)[1] or ''
  if first ~= ARGV[8] then return {0, -2, first} end
elseif ARGV[4] == '0'
    and redis.call('ZCARD', KEYS[11]) == 0 and redis.call('EXISTS', KEYS[14], KEYS[15]) == 0
    and (ARGV[5] == '0' or (redis.call('HLEN', KEYS[13]) == 1
                            and redis.call('HEXISTS', KEYS[13], ARGV[2]) == 1)) then
  -- The common case, answered before anything below is defined: the caller reads band 5 in
  -- bulk, no entry was returned, no other band is in use, no message group was seen, and the
  -- group is this replica's alone (ARGV[5] '0') or this replica alone keeps a record in the
  -- sharing, its own. All below would find nothing to hand out and write nothing; a call costs
  -- Redis about half of what the whole script costs (docs/performance.md#bulk-fetch).
  return {0, -1, 0}
end
local want = tonumber(ARGV[3])
local out = {0, -1, 0}

--! include entry_fields
--! include share
local grouped = redis.call('EXISTS', KEYS[15]) == 1  -- the subscription has seen a group
local parked_any = false
local function padded(band, id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return string.format('%s|%015d-%010d', band, tonumber(ms), tonumber(seq))
end

-- whether an entry of message group ``g`` goes out here: yes if this replica owns the group or
-- nobody does (it takes it); if another replica owns it, it is claimed for that one and parked
local function mine(band, id, g)
  local owner = redis.call('HGET', KEYS[15], g)
  if not owner then
    redis.call('HSET', KEYS[15], g, ARGV[2])
    redis.call('ZADD', KEYS[17], 0, ARGV[2] .. '|' .. g)
    grouped = true
    return true
  end
  if owner == ARGV[2] then return true end
  redis.call('XCLAIM', KEYS[band + 1], ARGV[1], owner, 0, id, 'JUSTID')
  redis.call('ZADD', KEYS[16], 0, owner .. '|' .. padded(band, id))
  parked_any = true
  return false
end

local function emit(band, entry, count)
  local h, r, x, c, g = entry_fields(entry[2])
  if g ~= '' and not mine(band, entry[1], g) then return end
  out[#out + 1] = band
  out[#out + 1] = entry[1]
  out[#out + 1] = h
  out[#out + 1] = r
  out[#out + 1] = x
  out[#out + 1] = count
  out[#out + 1] = c
  out[#out + 1] = g
  want = want - 1
end

-- Where the group stands in each band, while the subscription is shared: the shares HASH keeps
-- field '>' .. band = '<id> <read>': the id of the last entry a fetch read there (the group's
-- last-delivered-id as fetches leave it) and the group's entries-read then ('-': not known), so
-- what is unread is counted from it in time constant in the number of groups on the stream
-- (XINFO GROUPS lists them all: docs/performance.md, "Sharing between replicas"): the stream's
-- entries-added (XINFO STREAM) less entries-read, unless an entry past the id was deleted; else
-- up to COUNTED entries one by one; Redis's lag (XINFO GROUPS) only when neither tells.
-- A plain read beside the script, or a purge, may have moved the group on since: then more is
-- counted than is there, the sharing hands out a little more than it should for one fetch, and
-- the next read sets the field right. The fields go once the subscription has one replica again,
-- so a lone replica's fast path (HEXISTS, HLEN) stays as it was.
local CURSOR = '>'
local COUNTED = 64
local cursors = {}  -- band -> '<id> <read>', from the shares HASH (share_records) or this fetch
local cursor_moved = {}
local added = {}  -- band -> the stream's entries-added, when this fetch asked

local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function id_after(a, b)  -- whether stream id a comes after b
  local am, as = parse_id(a)
  local bm, bs = parse_id(b)
  return am > bm or (am == bm and as > bs)
end
local function cursor_of(band)
  local c = cursors[band]
  if not c then return nil, nil end
  local id, read = string.match(c, '^(%S+) (%S+)$')
  return id, tonumber(read)
end
local function set_cursor(band, id, read)
  cursors[band] = id .. ' ' .. (read and string.format('%d', read) or '-')
  cursor_moved[band] = true
end

local function unread_from_groups(band)
  -- the group's lag, or (when Redis cannot tell it, after a deletion inside the stream) counted,
  -- up to a bound; and where it stands
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[band + 1])) do
    local name, last, lag, read = nil, nil, nil, nil
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1]
      elseif g[j] == 'last-delivered-id' then last = g[j + 1]
      elseif g[j] == 'entries-read' then read = g[j + 1]
      elseif g[j] == 'lag' then lag = g[j + 1] end
    end
    if name == ARGV[1] then
      set_cursor(band, last, read or nil)
      if lag then return lag end
      return #redis.call('XRANGE', KEYS[band + 1], '(' .. last, '+', 'COUNT', 1000)
    end
  end
  return 0
end

local function unread(band)
  -- entries of the band no replica has been handed yet
  if redis.call('XLEN', KEYS[band + 1]) == 0 then return 0 end
  local at, read = cursor_of(band)
  if at and read then
    local info = redis.call('XINFO', 'STREAM', KEYS[band + 1])
    local total, deleted = nil, '0-0'
    for j = 1, #info, 2 do
      if info[j] == 'entries-added' then total = info[j + 1]
      elseif info[j] == 'max-deleted-entry-id' then deleted = info[j + 1] end
    end
    if total then added[band] = total end
    if total and not id_after(deleted, at) and total >= read then return total - read end
  end
  if at then
    local n = #redis.call('XRANGE', KEYS[band + 1], '(' .. at, '+', 'COUNT', COUNTED)
    if n < COUNTED then return n end
  end
  return unread_from_groups(band)
end

-- the bands to read: 5 and those in use, in order
local bands, in_use = {}, {}
for _, b in ipairs(redis.call('SMEMBERS', KEYS[14])) do in_use[tonumber(b)] = true end
in_use[5] = true
for b = 0, 9 do if in_use[b] then bands[#bands + 1] = b end end

-- entries parked for this replica are its own: the sharing below does not count them
local mine_parked = {}
if grouped then
  local prefix = ARGV[2] .. '|'
  mine_parked = redis.call('ZRANGEBYLEX', KEYS[16], '[' .. prefix, '[' .. prefix .. '\255',
                           'LIMIT', 0, want)
end
local parked_limit = want

local consumers = tonumber(ARGV[5])
local sharing = false  -- another replica serves the subscription: keep where the group stands
local function share_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local fast = nil  -- this replica's record, when the rule grants it all it can take (below)
local function share_by_rule(shares, ids, others, known)
  local available = 0
  if others then
    available = redis.call('ZCOUNT', KEYS[11], '-inf', share_now())
    for _, band in ipairs(bands) do available = available + unread(band) end
  end
  local granted = share_grant(shares, ids, ARGV[2], consumers, tonumber(ARGV[6]), available,
                              share_now())
  local flat = {}
  for _, id in ipairs(ids) do
    flat[#flat + 1] = id
    flat[#flat + 1] = share_encode(shares[id])
  end
  if others then
    sharing = true
  else  -- the others have left: where the group stands is of no use until they come back
    local gone = {}
    for band in pairs(cursors) do gone[#gone + 1] = CURSOR .. band end
    if #gone > 0 then redis.call('HDEL', KEYS[13], unpack(gone)) end
    cursors = {}
  end
  redis.call('HSET', KEYS[13], unpack(flat))
  if others then
    want = math.min(want, granted + #mine_parked)
    if want <= 0 then  -- nothing popped here: still say when a waiting entry is due
      local head = redis.call('ZRANGE', KEYS[11], 0, 0, 'WITHSCORES')
      if head[2] and head[2] ~= '0' then out[3] = math.max(tonumber(head[2]) - share_now(), 0) end
    end
    out[2] = math.max(available + #mine_parked - want, 0)
    if known == 0 then redis.call('SPUBLISH', ARGV[7], ARGV[2]) end
  end
end
if consumers > 0 then
  local known = redis.call('HEXISTS', KEYS[13], ARGV[2])
  if redis.call('HLEN', KEYS[13]) > known then
    -- another replica keeps a record: the sharing rule decides what this one may take
    local shares, ids = share_records(KEYS[13], CURSOR, cursors)
    local others = share_others(shares, ARGV[2])
    if others and known == 1 and ARGV[4] == '1' and not grouped
        and share_others_idle(shares, ARGV[2]) then
      -- the fast path: the others have nothing reserved and no free credit, so the rule grants
      -- this replica min(its credit, what is available) and leaves their records as they are;
      -- the read finds what is available, and only this replica's record is written, after it
      fast = shares[ARGV[2]]
      sharing = true
      want = math.min(want, tonumber(ARGV[6]))
      out[2] = 0
    else
      share_by_rule(shares, ids, others, known)
    end
  elseif known == 0 then  -- alone, and first: the record a replica that joins will see
    local shares, ids = {}, {}
    share_grant(shares, ids, ARGV[2], consumers, tonumber(ARGV[6]), 0, share_now())
    redis.call('HSET', KEYS[13], ARGV[2], share_encode(shares[ARGV[2]]))
  end
  -- alone and known: nothing to share, nothing to write (its record is refreshed once another
  -- replica joins, whose first fetch wakes it)
end

if ARGV[8] then  -- exclusive: nothing overtakes a returned entry waiting out its delay
  local now = share_now()
  local waiting = redis.call('ZRANGEBYSCORE', KEYS[11], '(' .. now, '+inf', 'WITHSCORES',
                             'LIMIT', 0, 1)
  if waiting[2] then
    out[3] = tonumber(waiting[2]) - now
    return out
  end
end

-- the returned entries due, by band (looked at: the first ``want`` of the ZSET)
local returned = {}
local function returned_list(band)  -- the band's returned members, the band read from now on
  if not returned[band] then
    returned[band] = {}
    if not in_use[band] then
      in_use[band] = true
      bands[#bands + 1] = band
      table.sort(bands)
    end
  end
  return returned[band]
end
-- with message groups, what lies past a cut-off look (the ZSET's head, or the parked entries')
-- waits for the next fetch, and so does everything newer: an entry parked for another replica
-- costs no credit, so the look may end before the credit does (``bound``: members from it on)
local bound = nil
-- a look ended at ``bound`` with credit left, or (message groups) a returned entry waits out a
-- redelivery delay: nothing newer goes out
local cut = false
if want > 0 then
  local head = redis.call('ZRANGE', KEYS[11], 0, want - 1, 'WITHSCORES')
  if grouped and #head == 2 * want then bound = head[#head - 1] .. '~' end
  local now = nil
  for j = 1, #head, 2 do
    if head[j + 1] ~= '0' then  -- delayed: due yet?
      now = now or share_now()
      local wait = tonumber(head[j + 1]) - now
      if wait > 0 then
        out[3] = wait
        if grouped then  -- it and what sorts after it wait, and no new entry goes past it
          bound = head[j]
          cut = true
        end
        break
      end
    end
    local list = returned_list(tonumber(string.sub(head[j], 1, 1)))
    list[#list + 1] = head[j]
  end
end
-- entries parked for this replica join its returned ones, band by band, in member order
local from_parked = {}
if want > 0 and #mine_parked > 0 then
  local prefix = ARGV[2] .. '|'
  if #mine_parked >= parked_limit then
    local last = string.sub(mine_parked[#mine_parked], #prefix + 1) .. '~'
    if not bound or last < bound then bound = last end
  end
  for _, full in ipairs(mine_parked) do
    local member = string.sub(full, #prefix + 1)
    from_parked[member] = full
    local list = returned_list(tonumber(string.sub(member, 1, 1)))
    list[#list + 1] = member
  end
  if #mine_parked > 0 then
    for _, list in pairs(returned) do table.sort(list) end
  end
end

local function claim_returned(band)
  for _, member in ipairs(returned[band] or {}) do
    if want <= 0 then return end
    if bound and member >= bound then
      cut = true
      return
    end
    local full = from_parked[member]
    if full then redis.call('ZREM', KEYS[16], full) else redis.call('ZREM', KEYS[11], member) end
    local ms, seq = string.match(member, '^%d|(%d+)-(%d+)$')
    local id = (string.match(ms, '^0*(%d-%d)$')) .. '-' .. (string.match(seq, '^0*(%d-%d)$'))
    local claimed = redis.call('XCLAIM', KEYS[band + 1], ARGV[1], ARGV[2], 0, id)
    -- an entry trimmed or deleted meanwhile is dropped from the pending list by XCLAIM
    if #claimed > 0 and claimed[1] then
      local count = redis.call('HGET', KEYS[12], band .. '|' .. claimed[1][1]) or '0'
      emit(band, claimed[1], count)
    end
  end
end

local GROUP_ROUNDS = 8  -- reads of a band while what is read is parked for other replicas
local function read_new(band)
  if want <= 0 then return end
  if cut then  -- look again soon
    if out[3] == 0 then out[3] = 1 end
    return
  end
  -- an empty band costs an XLEN, not an XREADGROUP
  if redis.call('XLEN', KEYS[band + 1]) > 0 then
    for round = 1, GROUP_ROUNDS do
      local asked = want
      local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', asked,
                             'STREAMS', KEYS[band + 1], '>')
      if not res then return end
      -- never delivered to this group before: no failed attempts to count (no HGET)
      for _, entry in ipairs(res[1][2]) do emit(band, entry, '0') end
      local got = res[1][2]
      if sharing and #got > 0 then  -- the group now stands at the last entry read
        local _, read = cursor_of(band)
        if #got < asked and added[band] then read = added[band]  -- at the end
        elseif read then read = read + #got end
        set_cursor(band, got[#got][1], read)
      end
      -- short, or all taken here: done; read on only past entries parked for others
      if #res[1][2] < asked or want <= 0 or not grouped then return end
      if round == GROUP_ROUNDS and out[3] == 0 then out[3] = 1 end
    end
  end
end

-- band 5 is left to the caller's XREADGROUP (ARGV[4] '0') only when nothing after it waits
local read_default = ARGV[4] == '1'
if not read_default then
  for _, band in ipairs(bands) do
    if band > 5 and (returned[band] or redis.call('XLEN', KEYS[band + 1]) > 0) then
      read_default = true
    end
  end
end
local default_new = 0  -- new band-5 entries handed out
for _, band in ipairs(bands) do
  if want <= 0 then break end
  claim_returned(band)
  if band ~= 5 then
    read_new(band)
  elseif read_default then
    local before = #out
    read_new(band)
    default_new = (#out - before) / 8
  else
    break
  end
end
out[1] = (#out - 3) / 8 - default_new
-- a subscription with message groups is never read in bulk beside this script (a plain read
-- would hand out entries without their owner's say): it reports one entry more than new
-- band-5 ones, which makes the caller give back what such a read took
if grouped and out[1] == 0 then out[1] = 1 end
if sharing then
  local moved = {}
  if fast then  -- this replica's record as the rule leaves it, granted min(credit, available)
    local credit, taken = tonumber(ARGV[6]), (#out - 3) / 8
    local granted = taken  -- short of the count: the read took all there was
    if taken >= credit then
      granted = credit
    elseif want <= 0 then  -- the count ran out before the credit: what more is there?
      local more = redis.call('ZCOUNT', KEYS[11], '-inf', share_now())
      for _, band in ipairs(bands) do more = more + unread(band) end
      granted = math.min(credit, taken + more)
      out[2] = more
    end
    fast.k, fast.w, fast.t, fast.at = consumers, credit - granted, 0, share_now()
    moved[1], moved[2] = ARGV[2], share_encode(fast)
  end
  for band in pairs(cursor_moved) do
    moved[#moved + 1] = CURSOR .. band
    moved[#moved + 1] = cursors[band]
  end
  if #moved > 0 then redis.call('HSET', KEYS[13], unpack(moved)) end
end
if parked_any then redis.call('SPUBLISH', ARGV[7], ARGV[2]) end
return out
