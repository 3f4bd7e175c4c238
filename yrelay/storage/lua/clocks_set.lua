-- Bring a document's clocks hash (its state vector, see yrelay/admission.py)
-- up to date after entries written without it, by compare-and-set.
--
-- KEYS[1] meta hash, KEYS[2] clocks hash
-- ARGV[1] the clocks_through the caller started from ('' for none),
-- ARGV[2] the last id the new clocks account for, then (client, clock) pairs.
-- Returns 1 when stored, 0 when meta moved meanwhile (the caller starts again).
local meta, clocks = KEYS[1], KEYS[2]
local through = redis.call('HGET', meta, 'clocks_through') or ''
if through ~= ARGV[1] then return 0 end
for i = 3, #ARGV, 2 do
  local held = tonumber(redis.call('HGET', clocks, ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > held then
    redis.call('HSET', clocks, ARGV[i], ARGV[i + 1])
  end
end
redis.call('HSET', meta, 'clocks_through', ARGV[2], 'layout', 2)
return 1
