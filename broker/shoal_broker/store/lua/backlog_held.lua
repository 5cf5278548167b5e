-- Included by the scripts that limit an address's backlog (store/scripts.py): the entries its
-- ten streams KEYS[first..first + 9] hold.
local function backlog_held(first)
  local held = 0
  for i = first, first + 9 do held = held + redis.call('XLEN', KEYS[i]) end
  return held
end
