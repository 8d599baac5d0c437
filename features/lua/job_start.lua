-- Apply one job-start event: count the attempt, atomically and at most once.
-- Checked before written (see job_finish.lua): a refused start leaves no trace.
-- KEYS: job hash, job seen-set
-- ARGV: event_id, the starts counter field, ttl seconds
-- Returns 1 when applied, 0 for a duplicate.
local ttl = tonumber(ARGV[3])
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return 0 end
check_counter_name(ARGV[2])
check_counter(KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return 1
