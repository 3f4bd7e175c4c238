-- One member's heartbeat, and the leader lease (yrelay/consumers/membership.py).
--
-- KEYS[1] members, KEYS[2] leader, KEYS[3] meta, KEYS[4] the deletion mark
-- ARGV[1] member id, ARGV[2] lease (ms), ARGV[3] 1 = leave the group
--
-- The member's entry lapses `lease` after this call (Redis time). The leader
-- lease is renewed when this member holds it and taken when nobody does
-- (elections counted in meta). Leaving drops both at once.
-- A deleted group (DELETE /ops/groups) is not joined again: the 4th value is 1.
-- Returns {1 if this member leads, Redis now ms, assignment rev, 1 if deleted}.
local members, leader, meta = KEYS[1], KEYS[2], KEYS[3]
local member, lease = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
if redis.call('EXISTS', KEYS[4]) == 1 then return {0, now, 0, 1} end
if ARGV[3] == '1' then
  redis.call('ZREM', members, member)
  if redis.call('GET', leader) == member then redis.call('DEL', leader) end
  return {0, now, redis.call('HGET', meta, 'rev') or '0', 0}
end
redis.call('ZADD', members, now + lease, member)
local holder = redis.call('GET', leader)
local leads = 0
if holder == member then
  redis.call('PEXPIRE', leader, lease)
  leads = 1
elseif not holder then
  redis.call('SET', leader, member, 'PX', lease)
  redis.call('HINCRBY', meta, 'elections', 1)
  leads = 1
end
return {leads, now, redis.call('HGET', meta, 'rev') or '0', 0}
