-- Apply job-start events: count each attempt, atomically and at most once.
-- Checked before written (see job_finish.lua): a refused start leaves no trace.
-- KEYS: per job of the call: job hash, job seen-set
-- ARGV: the starts counter field, ttl seconds; then per event, in order: the index in KEYS of its
--       job hash, event_id
-- Returns per event 1 when applied, 0 for a duplicate.
local counter, ttl = ARGV[1], tonumber(ARGV[2])

local function start(k, id)
  local job, seen = KEYS[k], KEYS[k + 1]
  if redis.call('SISMEMBER', seen, id) == 1 then return 0 end
  check_counter_name(counter)
  check_counter(job, counter)
  redis.call('SADD', seen, id)
  redis.call('HINCRBY', job, counter, 1)
  redis.call('EXPIRE', job, ttl)
  redis.call('EXPIRE', seen, ttl)
  return 1
end

return apply_all(2, 2, start)
