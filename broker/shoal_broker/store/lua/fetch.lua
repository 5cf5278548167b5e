-- Hand up to ARGV[3] entries of a subscription to one replica (the consumer ARGV[2]).
--
-- KEYS[1] stream band 0, KEYS[2] stream band 1,
-- KEYS[3] returned ZSET of the group, KEYS[4] delivery-count HASH of the group
-- ARGV[1] group, ARGV[2] consumer (replica id), ARGV[3] count,
-- ARGV[4] '1': read the normal band here too; '0': leave it to the plain XREADGROUP the caller
--         sends right after this script (an entry handed back through Lua costs Redis ~3 µs more
--         than one read directly, docs/benchmarks.md session 5; when this script finds
--         returned or high-band entries, the caller gives what that read took back behind them)
-- Returned (released or failed) entries come first, oldest first, claimed from whichever replica
-- held them; then new entries, high band (1) before normal band (0).
-- Returns how many returned or high-band entries it found, then a flat array of septuples:
-- band, id, header, rest, expiry, delivery count, origin.
local want = tonumber(ARGV[3])
local out = {0}

--! include entry_fields
local function emit(band, entry, count)
  local h, r, x, c = entry_fields(entry[2])
  out[#out + 1] = band
  out[#out + 1] = entry[1]
  out[#out + 1] = h
  out[#out + 1] = r
  out[#out + 1] = x
  out[#out + 1] = count
  out[#out + 1] = c
  want = want - 1
end

while want > 0 do
  local popped = redis.call('ZPOPMIN', KEYS[3])
  if #popped == 0 then break end
  local band, ms, seq = string.match(popped[1], '^(%d)|(%d+)-(%d+)$')
  local id = (string.match(ms, '^0*(%d-%d)$')) .. '-' .. (string.match(seq, '^0*(%d-%d)$'))
  local claimed = redis.call('XCLAIM', KEYS[tonumber(band) + 1], ARGV[1], ARGV[2], 0, id)
  -- an entry trimmed or deleted meanwhile is dropped from the pending list by XCLAIM
  if #claimed > 0 and claimed[1] then
    local count = redis.call('HGET', KEYS[4], band .. '|' .. claimed[1][1]) or '0'
    emit(tonumber(band), claimed[1], count)
  end
end

local function read_new(band)
  if want <= 0 then return end
  -- an empty band (the high one, for most applications) costs an XLEN, not an XREADGROUP
  if redis.call('XLEN', KEYS[band + 1]) > 0 then
    local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want,
                           'STREAMS', KEYS[band + 1], '>')
    if res then
      -- never delivered to this group before: no failed attempts to count (no HGET)
      for _, entry in ipairs(res[1][2]) do emit(band, entry, '0') end
    end
  end
end

read_new(1)
out[1] = (#out - 1) / 7
if ARGV[4] == '1' then read_new(0) end
return out
