-- Add paired-ratio observations to hardware pairs' windows at one level each (model type, family
-- or all jobs). Idempotent like lookup.lua: an observation already in the window is found there
-- by its event id, and one that was evicted is older than every kept entry, so it is dropped again.
-- Like lookup.lua, each (pair hash, pair field) window is read once per call and written once.
-- Checked before written (see job_finish.lua): a refused observation leaves no trace.
-- KEYS: the pair hashes of the call
-- ARGV: window size; then per observation, in order: the index in KEYS of its pair hash, pair
--       field, event_time, event_id, packed pair value
-- Returns per observation 1 when it entered the window, 0 otherwise.
local size = tonumber(ARGV[1])
local windows, order = {}, {}

local function open_window(k, field)
  return {k = k, field = field, entries = window_entries(check_window(KEYS[k], field, false)), changed = false}
end

local function window_of(k, field)
  return window_cached(windows, order, k, field, open_window)
end

local function observe(k, field, time, id, value)
  check_number('time', time)
  local w = window_of(k, field)
  local inserted, kept = window_add(w.entries, time, id, value, size)
  if not (inserted and kept) then return 0 end
  w.changed = true
  return 1
end

local reply = apply_all(1, 5, observe)
for _, w in ipairs(order) do
  if w.changed then redis.call('HSET', KEYS[w.k], w.field, pack_parsed(w.entries)) end
end
return reply
