-- Included by fetch.lua and publish_claim.lua (store/scripts.py): a stream entry's fields as
-- append_entries.lua wrote them, returned as header, rest, expiry ('0' = never), origin and
-- message group ('' = none).
local function entry_fields(fields)
  local h, r, x, c, g = '', '', '0', '', ''
  for j = 1, #fields, 2 do
    local f = fields[j]
    if f == 'h' then h = fields[j + 1] elseif f == 'r' then r = fields[j + 1]
    elseif f == 'x' then x = fields[j + 1] elseif f == 'c' then c = fields[j + 1]
    elseif f == 'g' then g = fields[j + 1] end
  end
  return h, r, x, c, g
end
