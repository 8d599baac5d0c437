-- Shared helpers: a bounded window of the newest observations of one (entity, hardware), and the
-- loop that applies a batch of events in one script call.
-- Runs after formats.lua (the stored formats' helpers), which packs and parses
-- windows; entries keep the exact texts the writer sent (time, id, value), so that reading them
-- back is lossless; numbers are parsed (t, v) only to order and to take the median.
-- A window is ordered by (time, id), oldest first.
-- The window's content depends only on the set of events applied, never on their order:
-- an event older than every kept one is dropped on arrival, exactly as it would have been
-- evicted had it arrived first.

-- A window here is check_window's parsed form (parse_window in formats.lua): parallel arrays of
-- the entries' texts, parts and numbers, in window order.

local WINDOW_ARRAYS = {'text', 'time', 'id', 'value', 't', 'v'}

local function older(t1, id1, t2, id2)
  if t1 ~= t2 then return t1 < t2 end
  return id1 < id2
end

-- A window from check_window, in window order: one that some other writer left out of order
-- is sorted once, as inserting into it used to sort it.
local function window_entries(w)
  if not w.unsorted then return w end
  w.unsorted = nil
  local order = {}
  for i = 1, #w.id do order[i] = i end
  table.sort(order, function(a, b) return older(w.t[a], w.id[a], w.t[b], w.id[b]) end)
  for _, name in ipairs(WINDOW_ARRAYS) do
    local before, after = w[name], {}
    for i, j in ipairs(order) do after[i] = before[j] end
    w[name] = after
  end
  return w
end

-- w: a window from window_entries (changed in place).
-- Returns inserted (the id was not there) and kept (the id is in the window after trimming).
-- The new entry goes to its place by (time, id) and the oldest beyond limit are dropped: the
-- same window as appending and sorting, since no two entries share an id.
local function window_add(w, time, id, value, limit)
  local ids, ts = w.id, w.t
  for i = 1, #ids do
    if ids[i] == id then return false, true end
  end
  local t = tonumber(time)
  local at = #ids
  while at > 0 and older(t, id, ts[at], ids[at]) do at = at - 1 end
  local new = {text = pack_window_entry(time, id, value), time = time, id = id, value = value, t = t,
               v = tonumber(value) or false}
  for _, name in ipairs(WINDOW_ARRAYS) do table.insert(w[name], at + 1, new[name]) end
  local drop = #ids - limit
  for _ = 1, drop do
    for _, name in ipairs(WINDOW_ARRAYS) do table.remove(w[name], 1) end
  end
  return true, at + 1 > drop
end

-- window_add on a window fresh from check_window; returns the window, inserted, kept.
local function window_insert(w, time, id, value, limit)
  window_entries(w)
  local inserted, kept = window_add(w, time, id, value, limit)
  return w, inserted, kept
end

-- A window's values in ascending order (a copy).
local function sorted_values(w)
  local values = {unpack(w.v)}
  table.sort(values)
  return values
end

-- The median of values in ascending order, as stored.
local function median_sorted(values)
  local n = #values
  local m
  if n % 2 == 1 then m = values[(n + 1) / 2] else m = (values[n / 2] + values[n / 2 + 1]) / 2 end
  return format_number(m)
end

local function median(w)
  return median_sorted(sorted_values(w))
end

-- The first index of ascending values at which v belongs (before any equal value).
local function sorted_index(values, v)
  local lo, hi = 1, #values + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if values[mid] < v then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- The window of ``cache[k][sub]``, opened by ``open(k, sub)`` on first use and then listed in
-- ``order`` (so that a call writes each window it changed once, in the order first seen).
local function window_cached(cache, order, k, sub, open)
  local by_sub = cache[k]
  if not by_sub then
    by_sub = {}
    cache[k] = by_sub
  end
  local w = by_sub[sub]
  if not w then
    w = open(k, sub)
    by_sub[sub] = w
    order[#order + 1] = w
  end
  return w
end

-- The batch form every script takes (features.redis_batch.Batch.scripts): ARGV holds `header`
-- arguments, then `width` arguments per event, the first of which is the index in KEYS of the
-- event's first key. apply(first_key_index, args...) handles one event and returns its reply
-- values; an event it refuses (reject, or any error) is left out and the others still run, each
-- in order. Returns every event's values in one flat list, or the first refusal as an error reply
-- once every event was tried: a refusal leaves no trace, so the writer's retry judges it again.
local function apply_all(header, width, apply)
  local out, refusal = {}, nil
  for i = header + 1, #ARGV, width do
    local reply = {pcall(apply, tonumber(ARGV[i]), unpack(ARGV, i + 1, i + width - 1))}
    if reply[1] then
      for j = 2, #reply do out[#out + 1] = reply[j] end
    elseif refusal == nil then
      local e = reply[2]
      refusal = type(e) == 'table' and e.err or tostring(e)
    end
  end
  if refusal then return redis.error_reply(refusal) end
  return out
end
