-- Apply job-finish events to their jobs' state, each atomically and at most once, and record the
-- paired-ratio observations each yields (its throughput over the job's robust throughput on each
-- other hardware type) in the job's outbox, so that a redelivered finish yields the same ones.
-- Everything is checked before anything is written: a refused event (see reject in formats.lua
-- and apply_all in window.lua) leaves no trace, so a retry judges it again instead of taking it
-- for a duplicate, and the agent dead-letters it.
-- KEYS: per job of the call: job hash, job window hash, job seen-set, job outbox hash
-- ARGV: window size, ttl seconds; then per event, in order: the index in KEYS of its job hash,
--       event_id, event_time, hardware, per-accelerator throughput ('' if none), the outcome's
--       counter field
-- Returns per event 1, observations when applied and 0, observations for a duplicate: the packed
-- pair observations (pack_observations; '' when none); the writer adds them to the pair windows.
local size, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])

local function finish(k, id, time, hw, value, counter)
  local job, win, seen, outbox = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  if redis.call('SISMEMBER', seen, id) == 1 then
    return 0, redis.call('HGET', outbox, id) or ''
  end
  check_number('time', time)
  check_name(hw)
  check_counter_name(counter)
  check_counter(job, counter)
  local observed, window, field = {}, nil, nil
  if value ~= '' then
    local v = check_positive('throughput', value)
    field = check_job_field(job, hw)
    window = check_window(win, hw, true)
    if pairable(hw) then
      local fields = redis.call('HGETALL', job)
      for i = 1, #fields, 2 do
        local other = fields[i]
        if other ~= hw and not is_counter(other) and pairable(other) then
          -- another hardware's unreadable field yields no observation (reads skip it too)
          local robust = tonumber(unpack_job_field(fields[i + 1]).robust or '')
          if robust and robust > 0 and robust < math.huge then
            observed[#observed + 1] = pack_pair_observation(other, format_number(math.log(v) - math.log(robust)))
          end
        end
      end
    end
  end
  -- Checked: from here on nothing can fail halfway.
  redis.call('SADD', seen, id)
  redis.call('HINCRBY', job, counter, 1)
  if value ~= '' then
    local entries = window_insert(window, time, id, value, size)
    local n = count_of(field) + 1  -- read by the check above; nothing wrote it since
    local newest = #entries.id
    redis.call('HSET', job, hw, pack_job_field(n, entries.time[newest], entries.value[newest], median(entries)))
    redis.call('HSET', win, hw, pack_parsed(entries))
    redis.call('EXPIRE', win, ttl)
  end
  local packed = pack_observations(observed)
  if #observed > 0 then
    redis.call('HSET', outbox, id, packed)
    redis.call('EXPIRE', outbox, ttl)
  end
  redis.call('EXPIRE', job, ttl)
  redis.call('EXPIRE', seen, ttl)
  return 1, packed
end

return apply_all(2, 6, finish)
