-- Shared helpers: a bounded window of the newest observations of one (entity, hardware).
-- Runs after the generated prelude (features/layout.py, lua_prelude), which packs and unpacks
-- windows; entries are tables of the exact texts the writer sent ({time, id, value}), so that
-- reading them back is lossless; numbers are parsed (t, v) only to order and to take the median.
-- A window is ordered by (time, id), oldest first.
-- The window's content depends only on the set of events applied, never on their order:
-- an event older than every kept one is dropped on arrival, exactly as it would have been
-- evicted had it arrived first.

local function with_numbers(e)
  e.t, e.v = tonumber(e.time), tonumber(e.value)
  return e
end

local function older(a, b)
  if a.t ~= b.t then return a.t < b.t end
  return a.id < b.id
end

-- entries: the window as check_window returned it (parsed once per script).
-- Returns entries, inserted (the id was not there), kept (the id is in the window after trimming).
local function window_insert(entries, time, id, value, limit)
  -- Every entry gets its numbers first: callers take the median even when the id was there.
  for _, e in ipairs(entries) do with_numbers(e) end
  for _, e in ipairs(entries) do
    if e.id == id then return entries, false, true end
  end
  entries[#entries + 1] = with_numbers({time = time, id = id, value = value})
  table.sort(entries, older)
  while #entries > limit do table.remove(entries, 1) end
  local kept = false
  for _, e in ipairs(entries) do
    if e.id == id then kept = true end
  end
  return entries, true, kept
end

local function median(entries)
  local values = {}
  for i, e in ipairs(entries) do values[i] = e.v end
  table.sort(values)
  local n = #values
  local m
  if n % 2 == 1 then m = values[(n + 1) / 2] else m = (values[n / 2] + values[n / 2 + 1]) / 2 end
  return format_number(m)
end
