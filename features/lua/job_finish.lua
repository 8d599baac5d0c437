-- Apply one job-finish event to the job's state, atomically and at most once.
-- KEYS: job hash, job window hash, job seen-set
-- ARGV: event_id, event_time, hardware, per-accelerator throughput ('' if none),
--       the outcome's counter field, window size, ttl seconds
-- Returns 1 when applied, 0 for a duplicate.
local ttl = tonumber(ARGV[7])
if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[5], 1)
if ARGV[4] ~= '' then
  local entries = window_insert(redis.call('HGET', KEYS[2], ARGV[3]), ARGV[2], ARGV[1], ARGV[4],
                                tonumber(ARGV[6]))
  local n = count_of(redis.call('HGET', KEYS[1], ARGV[3])) + 1
  local newest = entries[#entries]
  redis.call('HSET', KEYS[1], ARGV[3], pack_job_field(n, newest.time, newest.value, median(entries)))
  redis.call('HSET', KEYS[2], ARGV[3], pack_window(entries))
  redis.call('EXPIRE', KEYS[2], ttl)
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
return 1
