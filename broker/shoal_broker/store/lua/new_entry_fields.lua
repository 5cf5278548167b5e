-- Included by append_entries.lua, commit_apply.lua and release_due.lua (store/scripts.py): the fields of a new
-- stream entry for XADD, as entry_fields.lua reads them back: h header, r rest, x expiry ms (left
-- out when '0' = never), c origin (left out when '') and g message group (left out when none).
-- ``origin`` carries the group after a unit separator (routing/storage.stored_origin).
local function new_entry_fields(header, rest, expiry, origin)
  local fields = {'h', header, 'r', rest}
  if expiry ~= '0' then
    fields[#fields + 1] = 'x'
    fields[#fields + 1] = expiry
  end
  local group = nil
  local cut = string.find(origin, '\31', 1, true)
  if cut then
    group = string.sub(origin, cut + 1)
    origin = string.sub(origin, 1, cut - 1)
  end
  if origin ~= '' then
    fields[#fields + 1] = 'c'
    fields[#fields + 1] = origin
  end
  if group then
    fields[#fields + 1] = 'g'
    fields[#fields + 1] = group
  end
  return fields
end
