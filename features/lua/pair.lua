-- Add one paired-ratio observation to a hardware pair's window at one level (model type, family
-- or all jobs). Idempotent like lookup.lua: an observation already in the window is found there
-- by its event id, and one that was evicted is older than every kept entry, so it is dropped again.
-- Checked before written (see job_finish.lua): a refused observation leaves no trace.
-- KEYS: pair hash of the level
-- ARGV: pair field, event_time, event_id, packed pair value, window size
-- Returns 1 when the observation entered the window, 0 otherwise.
check_number('time', ARGV[2])
local window = check_window(KEYS[1], ARGV[1], false)
local entries, inserted, kept = window_insert(window, ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]))
if not (inserted and kept) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], pack_window(entries))
return 1
