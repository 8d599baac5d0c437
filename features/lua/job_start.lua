-- Apply one job-start event: count attempts and remember the newest start (event-time guard).
-- KEYS: job hash, job seen-set
-- ARGV: event_id, event_time, hardware, ttl seconds
-- Returns 1 when applied, 0 for a duplicate.
local ttl = tonumber(ARGV[4])
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], '_starts', 1)
local last = redis.call('HMGET', KEYS[1], '_last_start', '_last_start_id')
local t = tonumber(ARGV[2])
local newer = (not last[1]) or t > tonumber(last[1]) or (t == tonumber(last[1]) and ARGV[1] > last[2])
if newer then
  redis.call('HSET', KEYS[1], '_last_start', ARGV[2], '_last_start_id', ARGV[1], '_last_start_hw', ARGV[3])
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return 1
