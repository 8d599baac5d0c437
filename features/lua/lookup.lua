-- Add observations to lookup aggregates (model type or family x hardware).
-- Idempotent without a seen-set: an event already in the window is found there, and one
-- that was evicted is older than every kept entry, so it is dropped again on arrival.
-- Each (aggregate, hardware) window is read and checked once per call, takes the call's
-- observations in order, and is written once at the end: the same bytes as one call per
-- observation (its count adds the observations that entered the window; the median is of the
-- final window).
-- A window with a sorted view that matches its text (SORTED_VIEW_SHA_HEX in features/layout.py)
-- is not parsed: an event goes into the text at the place its time has among the view's times,
-- the oldest entry is cut off the text's front, and the median is taken from the view's sorted
-- values; an event tied in time with a kept one parses the window as before (ids order the tie).
-- Either way the window text, the field and the view written are the same bytes.
-- Checked before written (see job_finish.lua): a refused observation leaves no trace.
-- KEYS: per aggregate of the call: aggregate hash, aggregate window hash, its sorted-view hash
-- ARGV: window size; then per observation, in order: the index in KEYS of its aggregate hash,
--       event_id, event_time, hardware, per-accelerator throughput
-- Returns per observation 1 when it entered the window, 0 otherwise.
local size = tonumber(ARGV[1])
local windows, order = {}, {}

local function open_window(k, hw)
  local field = check_lookup_field(KEYS[k], hw)
  local w = {k = k, hw = hw, n = count_of(field), changed = false}
  local packed = redis.call('HGET', KEYS[k + 1], hw)
  if not packed then  -- a new window: empty, and its view with it
    w.text, w.times, w.lengths, w.values = false, {}, {}, {}
    return w
  end
  local times, lengths, values = sorted_view(packed, redis.call('HGET', KEYS[k + 2], hw))
  if times then
    w.text, w.times, w.lengths, w.values = packed, times, lengths, values
  else
    w.entries = window_entries(check_window_text(KEYS[k + 1], hw, packed, true))
  end
  return w
end

local function window_of(k, hw)
  return window_cached(windows, order, k, hw, open_window)
end

-- Puts an event into a window kept as text and view (w.text); returns inserted, kept as
-- window_add does, or nil when a kept entry has the event's time (the caller parses the window).
local function view_add(w, time, id, value, t)
  local times, lengths, values = w.times, w.lengths, w.values
  local count = #times
  if count > 0 and window_has_id(w.text, id) then return false, true end
  local at = sorted_index(times, t)  -- the new entry's place: after every older one
  if count > size or times[at] == t then return nil end
  if count == size then  -- full: the oldest entry leaves, or the new one if it is the oldest
    if at == 1 then return true, false end
    local rest, oldest = window_drop_oldest(w.text, lengths[1])
    local i = oldest and sorted_index(values, oldest)
    if not i or values[i] ~= oldest then return nil end  -- (a view that matches its text cannot)
    table.remove(values, i)
    table.remove(times, 1)
    table.remove(lengths, 1)
    w.text, at = rest, at - 1
  end
  local entry, offset, v = pack_window_entry(time, id, value), 0, tonumber(value)
  for j = 1, at - 1 do offset = offset + lengths[j] + 1 end
  w.text = window_put(w.text, offset, entry)
  table.insert(times, at, t)
  table.insert(lengths, at, #entry)
  table.insert(values, sorted_index(values, v), v)
  return true, true
end

local function observe(k, id, time, hw, value)
  local t = check_number('time', time)
  check_name(hw)
  check_positive('throughput', value)
  local w = window_of(k, hw)
  local inserted, kept
  if w.text ~= nil then
    inserted, kept = view_add(w, time, id, value, t)
    if inserted == nil then  -- from here on this window is parsed, as without a view
      w.entries = window_entries(check_window_text(KEYS[w.k + 1], hw, w.text, true))
      w.text = nil
    end
  end
  if inserted == nil then inserted, kept = window_add(w.entries, time, id, value, size) end
  if not (inserted and kept) then return 0 end
  w.n, w.changed = w.n + 1, true
  return 1
end

local reply = apply_all(1, 5, observe)
for _, w in ipairs(order) do
  if w.changed then
    local packed, times, lengths, values = w.text, w.times, w.lengths, w.values
    if packed == nil then
      local e = w.entries
      packed, times, lengths, values = pack_parsed(e), e.t, {}, sorted_values(e)
      for i, entry in ipairs(e.text) do lengths[i] = #entry end
    end
    redis.call('HSET', KEYS[w.k], w.hw, pack_lookup_field(w.n, median_sorted(values)))
    redis.call('HSET', KEYS[w.k + 1], w.hw, packed)
    redis.call('HSET', KEYS[w.k + 2], w.hw, pack_sorted_view(redis.sha1hex(packed), times, lengths, values))
  end
end
return reply
