-- Add one observation to a lookup aggregate (model type or family x hardware).
-- Idempotent without a seen-set: an event already in the window is found there, and one
-- that was evicted is older than every kept entry, so it is dropped again on arrival.
-- Checked before written (see job_finish.lua): a refused observation leaves no trace.
-- KEYS: aggregate hash, aggregate window hash
-- ARGV: event_id, event_time, hardware, per-accelerator throughput, window size
-- Returns 1 when the observation entered the window, 0 otherwise.
check_number('time', ARGV[2])
check_name(ARGV[3])
check_positive('throughput', ARGV[4])
check_lookup_field(KEYS[1], ARGV[3])
local window = check_window(KEYS[2], ARGV[3], true)
local entries, inserted, kept = window_insert(window, ARGV[2], ARGV[1], ARGV[4], tonumber(ARGV[5]))
if not (inserted and kept) then return 0 end
local n = count_of(redis.call('HGET', KEYS[1], ARGV[3])) + 1
redis.call('HSET', KEYS[1], ARGV[3], pack_lookup_field(n, median(entries)))
redis.call('HSET', KEYS[2], ARGV[3], pack_window(entries))
return 1
