-- Add observations to lookup aggregates (model type or family x hardware).
-- Idempotent without a seen-set: an event already in the window is found there, and one
-- that was evicted is older than every kept entry, so it is dropped again on arrival.
-- Each (aggregate, hardware) window is read and checked once per call, takes the call's
-- observations in order, and is written once at the end: the same bytes as one call per
-- observation (its count adds the observations that entered the window; the median is of the
-- final window).
-- Checked before written (see job_finish.lua): a refused observation leaves no trace.
-- KEYS: per aggregate of the call: aggregate hash, aggregate window hash
-- ARGV: window size; then per observation, in order: the index in KEYS of its aggregate hash,
--       event_id, event_time, hardware, per-accelerator throughput
-- Returns per observation 1 when it entered the window, 0 otherwise.
local size = tonumber(ARGV[1])
local windows, order = {}, {}

local function open_window(k, hw)
  local field = check_lookup_field(KEYS[k], hw)
  local entries = window_entries(check_window(KEYS[k + 1], hw, true))
  return {k = k, hw = hw, entries = entries, n = count_of(field), changed = false}
end

local function window_of(k, hw)
  return window_cached(windows, order, k, hw, open_window)
end

local function observe(k, id, time, hw, value)
  check_number('time', time)
  check_name(hw)
  check_positive('throughput', value)
  local w = window_of(k, hw)
  local inserted, kept = window_add(w.entries, time, id, value, size)
  if not (inserted and kept) then return 0 end
  w.n, w.changed = w.n + 1, true
  return 1
end

local reply = apply_all(1, 5, observe)
for _, w in ipairs(order) do
  if w.changed then
    redis.call('HSET', KEYS[w.k], w.hw, pack_lookup_field(w.n, median(w.entries)))
    redis.call('HSET', KEYS[w.k + 1], w.hw, pack_parsed(w.entries))
  end
end
return reply
