-- The leader writes a new assignment (yrelay/consumers/leader.py).
--
-- KEYS[1] leader, KEYS[2] meta, KEYS[3] assignment, KEYS[4] members
-- ARGV[1] the leader's member id, then pairs: document, member ('' = none)
--
-- Only the current lease holder may write (a leader whose lease lapsed is
-- refused: -1). Every document that changes hands gets the new version, so
-- a claim by its new member outranks any claim of the previous one.
-- Returns the version handed out, or -1.
local leader, meta, assignment = KEYS[1], KEYS[2], KEYS[3]
if redis.call('GET', leader) ~= ARGV[1] then return -1 end
local version = redis.call('HINCRBY', meta, 'version', 1)
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', assignment, ARGV[i])
  else
    redis.call('HSET', assignment, ARGV[i], ARGV[i + 1] .. '|' .. version)
  end
end
redis.call('HINCRBY', meta, 'rev', 1)
redis.call('HINCRBY', meta, 'rebalances', 1)
return version
