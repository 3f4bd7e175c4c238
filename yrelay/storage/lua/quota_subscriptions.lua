-- Set this process's count of one subject's live subscriptions, unless
-- (check = 1) the subject would then hold more than `cap` across the
-- deployment. Counts of processes whose lease lapsed (crashed) are dropped.
-- KEYS[1] subscriptions hash (instance -> '<count>|<expires ms>');
-- ARGV: instance, count, cap, lease_ms, check.
-- Returns {1 stored | 0 refused, the subject's total with this count}.
local key, instance = KEYS[1], ARGV[1]
local count, cap, lease, check = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local now = now_ms()
local others = 0
local fields = redis.call('HGETALL', key)
for i = 1, #fields, 2 do
  local held, expires = string.match(fields[i + 1], '^(%d+)|(%d+)$')
  if not expires or tonumber(expires) <= now then
    redis.call('HDEL', key, fields[i])
  elseif fields[i] ~= instance then
    others = others + tonumber(held)
  end
end
if check and others + count > cap then return {0, others + count} end
if count > 0 then
  redis.call('HSET', key, instance, count .. '|' .. string.format('%d', now + lease))
  redis.call('PEXPIRE', key, lease)
else
  redis.call('HDEL', key, instance)
end
return {1, others + count}
