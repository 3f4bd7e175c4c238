-- A connection left a document: delete the entries it owns and return the
-- clientIDs whose removal should be relayed: those it owned and those no
-- longer stored (expired); not those another connection of the same session
-- took over since.
-- KEYS[1] presence hash; ARGV: origin, then clientIDs.
local key, origin = KEYS[1], ARGV[1]
local gone = {}
for i = 2, #ARGV do
  local value = redis.call('HGET', key, ARGV[i])
  local owner = value and string.match(value, '^%d+|[^|]*|([^|]*)|')
  if not value or owner == origin then
    if value then redis.call('HDEL', key, ARGV[i]) end
    gone[#gone + 1] = ARGV[i]
  end
end
return gone
