-- The stored value formats, generated from their declarations in features/layout.py and
-- features/sorted_view.py by `python -m features.lua_formats`: edit those, not this file.
local function pack_job_field(n, last_time, last, robust)
  return n .. ',' .. last_time .. ',' .. last .. ',' .. robust
end

local function pack_lookup_field(n, median)
  return n .. ',' .. median
end

local function pack_window_entry(time, id, value)
  return time .. ' ' .. id .. ' ' .. value
end

local function count_of(field)
  if not field then return 0 end
  return tonumber(string.match(field, '^([^,]+)'))
end

local function format_number(x)
  return string.format('%.17g', x)
end

local function unpack_window(packed)
  local entries = {}
  if not packed then return entries end
  for time, id, value in string.gmatch(packed, '([^ ;]+) ([^ ;]+) ([^ ;]+)') do
    entries[#entries + 1] = {time = time, id = id, value = value}
  end
  return entries
end
local function pack_window(entries)
  local packed = {}
  for i, e in ipairs(entries) do packed[i] = e.time .. ' ' .. e.id .. ' ' .. e.value end
  return table.concat(packed, ';')
end

-- A parsed window, and whether the text read back as written: entries that tile the text
-- exactly, one separator between two, a number for every time (and value, if numeric).
local function parse_window(packed, numeric)
  local texts, times, ids, values, ts, vs = {}, {}, {}, {}, {}, {}
  local w = {text = texts, time = times, id = ids, value = values, t = ts, v = vs}
  if not packed then return w, true end
  local ok, n, after = true, 0, 1
  local sep, byte, number = 59, string.byte, tonumber
  for at, text, time, id, value, stop in string.gmatch(packed, '()(([^ ;]+) ([^ ;]+) ([^ ;]+))()') do
    local next_byte = byte(packed, stop)
    if at ~= after or (next_byte ~= nil and next_byte ~= sep) then ok = false end
    after = stop + 1
    n = n + 1
    texts[n] = text
    times[n] = time
    ids[n] = id
    values[n] = value
    local t, v = number(time), number(value) or false
    ts[n], vs[n] = t, v
    if t == nil or (numeric and not v) then
      ok = false
    elseif n > 1 and ts[n - 1] and (t < ts[n - 1] or (t == ts[n - 1] and id < ids[n - 1])) then
      w.unsorted = true  -- not in window order: (time, id), oldest first
    end
  end
  if after ~= #packed + (n > 0 and 2 or 1) then ok = false end
  return w, ok
end
local function pack_parsed(w)
  return table.concat(w.text, ';')
end

local function unpack_job_field(text)
  local parts = {}
  for part in string.gmatch(text, '([^,]+)') do parts[#parts + 1] = part end
  return {n = parts[1], last_time = parts[2], last = parts[3], robust = parts[4]}
end

local function unpack_lookup_field(text)
  local parts = {}
  for part in string.gmatch(text, '([^,]+)') do parts[#parts + 1] = part end
  return {n = parts[1], median = parts[2]}
end

local function pack_pair_observation(hardware, log_ratio)
  return hardware .. ',' .. log_ratio
end

local function pack_observations(observed)
  return table.concat(observed, ';')
end
local function is_counter(field)
  return string.sub(field, 1, 1) == '_'
end
local function pairable(name)
  return #name > 0 and #name <= 64 and string.find(name, '[|,;\t\r\n]') == nil
end

local function reject(...)
  error({err = 'LEAP_REJECTED' .. ' ' .. table.concat({...}, ' ')})
end
local function check_number(what, text)
  local v = tonumber(text)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then
    reject(what, 'is not a finite number:', tostring(text))
  end
  return v
end
local function check_positive(what, text)
  local v = check_number(what, text)
  if v <= 0 then reject(what, 'is not positive:', text) end
  return v
end
local function check_name(hardware)
  if is_counter(hardware) then reject('hardware', hardware, 'starts with the counter marker') end
end
local function check_counter_name(field)
  if not is_counter(field) then reject('counter field', field, 'lacks the counter marker') end
end
local function check_counter(key, field)
  local v = redis.call('HGET', key, field)
  if v and not string.match(v, '^%-?%d+$') then reject(key, field, 'holds', v, 'not a count') end
end
local function check_window_text(key, field, packed, numeric)
  local w, ok = parse_window(packed or nil, numeric)
  if not ok then reject(key, field, 'holds an unreadable window') end
  return w
end
local function check_window(key, field, numeric)
  return check_window_text(key, field, redis.call('HGET', key, field), numeric)
end
local function check_job_field(key, field)
  local v = redis.call('HGET', key, field)
  if not v then return end
  local p = unpack_job_field(v)
  if tonumber(p.n) == nil or tonumber(p.last_time) == nil or tonumber(p.last) == nil or tonumber(p.robust) == nil or pack_job_field(p.n, p.last_time, p.last, p.robust) ~= v then reject(key, field, 'holds an unreadable value:', v) end
  return v
end
local function check_lookup_field(key, field)
  local v = redis.call('HGET', key, field)
  if not v then return end
  local p = unpack_lookup_field(v)
  if tonumber(p.n) == nil or tonumber(p.median) == nil or pack_lookup_field(p.n, p.median) ~= v then reject(key, field, 'holds an unreadable value:', v) end
  return v
end

-- The id is the only part between two entry separators, and no part holds one.
local function window_has_id(packed, id)
  return string.find(packed, ' ' .. id .. ' ', 1, true) ~= nil
end
local function window_put(packed, offset, entry)
  if not packed then return entry end
  if offset == 0 then return entry .. ';' .. packed end
  if offset > #packed then return packed .. ';' .. entry end
  return string.sub(packed, 1, offset) .. entry .. ';' .. string.sub(packed, offset + 1)
end
local function window_drop_oldest(packed, length)
  local oldest = tonumber(string.match(string.sub(packed, 1, length), '^[^ ]+ [^ ]+ (.+)$'))
  if length >= #packed then return false, oldest end
  return string.sub(packed, length + 2), oldest
end

local VIEW_FORMATS = {}
local function view_format(kind, n)
  local key = kind .. n
  local f = VIEW_FORMATS[key]
  if not f then f = '<' .. string.rep(kind, n); VIEW_FORMATS[key] = f end
  return f
end
local function view_part(kind, n, blob, at)
  local part = {struct.unpack(view_format(kind, n), blob, at)}
  local after = part[n + 1]
  part[n + 1] = nil  -- struct.unpack's next position
  return part, after
end
local function pack_sorted_view(sha_hex, times, lengths, values)
  local n = #times
  return struct.pack('<c40', sha_hex) .. struct.pack(view_format('d', n), unpack(times))
    .. struct.pack(view_format('H', n), unpack(lengths))
    .. struct.pack(view_format('d', n), unpack(values))
end
local function sorted_view(packed, blob)
  if not packed or not blob or #blob < 40 or (#blob - 40) % 18 ~= 0 then return nil end
  if string.sub(blob, 1, 40) ~= redis.sha1hex(packed) then return nil end
  local n = (#blob - 40) / 18
  local times, at = view_part('d', n, blob, 41)
  local lengths, at2 = view_part('H', n, blob, at)
  local values = view_part('d', n, blob, at2)
  return times, lengths, values
end
