-- The entries a newcomer should see: every field renewed within the timeout.
-- Older fields are deleted on the way (their owner's process may have died).
-- KEYS[1] presence hash; ARGV[1] timeout_ms. Returns the fresh field values.
local key, timeout = KEYS[1], tonumber(ARGV[1])
local now = now_ms()
local fields = redis.call('HGETALL', key)
local fresh = {}
for i = 1, #fields, 2 do
  local at = tonumber(string.match(fields[i + 1], '^(%d+)|'))
  if at and at + timeout > now then
    fresh[#fresh + 1] = fields[i + 1]
  else
    redis.call('HDEL', key, fields[i])
  end
end
return fresh
