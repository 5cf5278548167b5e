-- Included by append_entries.lua and commit_apply.lua (store/scripts.py): the fields of a new
-- stream entry for XADD, as entry_fields.lua reads them back: h header, r rest, x expiry ms (left
-- out when '0' = never) and c origin (left out when '').
local function new_entry_fields(header, rest, expiry, origin)
  local fields = {'h', header, 'r', rest}
  if expiry ~= '0' then
    fields[#fields + 1] = 'x'
    fields[#fields + 1] = expiry
  end
  if origin ~= '' then
    fields[#fields + 1] = 'c'
    fields[#fields + 1] = origin
  end
  return fields
end
