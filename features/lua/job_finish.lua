-- Apply one job-finish event to the job's state, atomically and at most once, and record the
-- paired-ratio observations it yields (its throughput over the job's robust throughput on each
-- other hardware type) in the job's outbox, so that a redelivered finish yields the same ones.
-- Everything is checked before anything is written: a refused event (an error reply, see
-- reject in the prelude) leaves no trace, so a retry judges it again instead of taking it for
-- a duplicate, and the agent dead-letters it.
-- KEYS: job hash, job window hash, job seen-set, job outbox hash
-- ARGV: event_id, event_time, hardware, per-accelerator throughput ('' if none),
--       the outcome's counter field, window size, ttl seconds
-- Returns {1, observations} when applied, {0, observations} for a duplicate: the packed pair
-- observations (pack_observations; '' when none); the writer adds them to the pair windows.
local ttl = tonumber(ARGV[7])
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then
  return {0, redis.call('HGET', KEYS[4], ARGV[1]) or ''}
end
check_number('time', ARGV[2])
check_name(ARGV[3])
check_counter_name(ARGV[5])
check_counter(KEYS[1], ARGV[5])
local observed, window = {}, nil
if ARGV[4] ~= '' then
  local value = check_positive('throughput', ARGV[4])
  check_job_field(KEYS[1], ARGV[3])
  window = check_window(KEYS[2], ARGV[3], true)
  if pairable(ARGV[3]) then
    local fields = redis.call('HGETALL', KEYS[1])
    for i = 1, #fields, 2 do
      local other = fields[i]
      if other ~= ARGV[3] and not is_counter(other) and pairable(other) then
        -- another hardware's unreadable field yields no observation (reads skip it too)
        local robust = tonumber(unpack_job_field(fields[i + 1]).robust or '')
        if robust and robust > 0 and robust < math.huge then
          observed[#observed + 1] = pack_pair_observation(other, format_number(math.log(value) - math.log(robust)))
        end
      end
    end
  end
end
-- Checked: from here on nothing can fail halfway.
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], ARGV[5], 1)
if ARGV[4] ~= '' then
  local entries = window_insert(window, ARGV[2], ARGV[1], ARGV[4], tonumber(ARGV[6]))
  local n = count_of(redis.call('HGET', KEYS[1], ARGV[3])) + 1
  local newest = entries[#entries]
  redis.call('HSET', KEYS[1], ARGV[3], pack_job_field(n, newest.time, newest.value, median(entries)))
  redis.call('HSET', KEYS[2], ARGV[3], pack_window(entries))
  redis.call('EXPIRE', KEYS[2], ttl)
end
local packed = pack_observations(observed)
if #observed > 0 then
  redis.call('HSET', KEYS[4], ARGV[1], packed)
  redis.call('EXPIRE', KEYS[4], ttl)
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
return {1, packed}
