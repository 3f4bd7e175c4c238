-- The entries a newcomer should see: the fields renewed within the timeout,
-- newest first, at most max_bytes of them together (the rest arrive with
-- their owners' next renewal). Older fields are deleted on the way (their
-- owner's process may have died).
-- KEYS[1] presence hash; ARGV[1] timeout_ms, ARGV[2] max_bytes. Returns the field values.
local key, timeout, max_bytes = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local fields = redis.call('HGETALL', key)
local fresh = {}
for i = 1, #fields, 2 do
  local at = tonumber(string.match(fields[i + 1], '^(%d+)|'))
  if at and at + timeout > now then
    fresh[#fresh + 1] = {at, fields[i + 1]}
  else
    redis.call('HDEL', key, fields[i])
  end
end
table.sort(fresh, function(a, b) return a[1] > b[1] end)
local greeting, size = {}, 0
for _, item in ipairs(fresh) do
  size = size + #item[2]
  if size > max_bytes then break end
  greeting[#greeting + 1] = item[2]
end
return greeting
