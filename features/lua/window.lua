-- Shared helpers: a bounded window of the newest observations of one (entity, hardware).
-- Entries are kept as the exact strings the writer sent, so that reading them back is
-- lossless; numbers are parsed only to order and to take the median.
-- Packed form: "time id value;time id value;..." ordered by (time, id), oldest first.
-- The window's content depends only on the set of events applied, never on their order:
-- an event older than every kept one is dropped on arrival, exactly as it would have been
-- evicted had it arrived first.

local function unpack_window(packed)
  local entries = {}
  if not packed then return entries end
  for ts, id, vs in string.gmatch(packed, '([^ ;]+) ([^ ;]+) ([^ ;]+)') do
    entries[#entries + 1] = {t = tonumber(ts), ts = ts, id = id, v = tonumber(vs), vs = vs}
  end
  return entries
end

local function pack_window(entries)
  local parts = {}
  for i, e in ipairs(entries) do parts[i] = e.ts .. ' ' .. e.id .. ' ' .. e.vs end
  return table.concat(parts, ';')
end

local function older(a, b)
  if a.t ~= b.t then return a.t < b.t end
  return a.id < b.id
end

-- Returns entries, inserted (the id was not there), kept (the id is in the window after trimming).
local function window_insert(packed, ts, id, vs, limit)
  local entries = unpack_window(packed)
  for _, e in ipairs(entries) do
    if e.id == id then return entries, false, true end
  end
  entries[#entries + 1] = {t = tonumber(ts), ts = ts, id = id, v = tonumber(vs), vs = vs}
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
  return string.format('%.17g', m)
end

local function count_of(summary)
  if not summary then return 0 end
  return tonumber(string.match(summary, '^([^,]+)'))
end
