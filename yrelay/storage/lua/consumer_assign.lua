-- The leader writes a new assignment (yrelay/consumers/leader.py).
--
-- KEYS[1] leader, KEYS[2] meta, KEYS[3] assignment, KEYS[4] members, KEYS[5] handover
-- ARGV[1] the leader's member id, ARGV[2] handover time (ms; 0 = move at once),
-- then pairs: document, member ('' = none)
--
-- Only the current lease holder may write (a leader whose lease lapsed is
-- refused: -1). Every document that changes hands gets the new version, so
-- a claim by its new member outranks any claim of the previous one.
-- Two-step handover: a document whose owner is alive is not moved here; it
-- is marked in KEYS[5] (target, version, deadline) and moves when the owner
-- releases it (consumer_release.lua), or when the leader sends it again
-- after the deadline or once the owner lapsed. A document sent back to its
-- owner cancels the handover and keeps the owner's version.
-- Returns the version handed out, or -1.
local leader, meta, assignment, members, handover = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
if redis.call('GET', leader) ~= ARGV[1] then return -1 end
local handover_ms = tonumber(ARGV[2])
local now = now_ms()
local version = redis.call('HINCRBY', meta, 'version', 1)
for i = 3, #ARGV, 2 do
  local doc, target = ARGV[i], ARGV[i + 1]
  local current = redis.call('HGET', assignment, doc)
  local owner = current and string.match(current, '^(.*)|')
  local pending = redis.call('HGET', handover, doc)
  if target == '' then
    redis.call('HDEL', assignment, doc)
    redis.call('HDEL', handover, doc)
  elseif owner == target then
    redis.call('HDEL', handover, doc)
  else
    local alive = owner and tonumber(redis.call('ZSCORE', members, owner) or '0') >= now
    local waiting, deadline = nil, 0
    if pending then waiting, deadline = string.match(pending, '^(.*)|%d+|(%d+)$') end
    if handover_ms > 0 and alive and not (waiting == target and tonumber(deadline) < now) then
      if waiting ~= target then
        redis.call('HSET', handover, doc, target .. '|' .. version .. '|' .. (now + handover_ms))
      end
    else
      redis.call('HSET', assignment, doc, target .. '|' .. version)
      redis.call('HDEL', handover, doc)
    end
  end
end
redis.call('HINCRBY', meta, 'rev', 1)
redis.call('HINCRBY', meta, 'rebalances', 1)
return version
