-- A connection left a document: delete the entries it owns and return the
-- clientIDs whose removal should be relayed: those it owned and those no
-- longer stored (expired); not those another connection of the same owner
-- took over since. Its claims stay for the timeout (as '<now>|<owner>|'), so
-- the clientID waits for its user to come back instead of going to whoever
-- asks first.
-- KEYS[1] presence hash, KEYS[2] owners hash; ARGV: origin, timeout_ms, then clientIDs.
local key, owners, origin, timeout = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2])
local now = string.format('%d', now_ms())
local gone = {}
for i = 3, #ARGV do
  local value = redis.call('HGET', key, ARGV[i])
  local owner = value and string.match(value, '^%d+|[^|]*|([^|]*)|')
  if not value or owner == origin then
    if value then redis.call('HDEL', key, ARGV[i]) end
    gone[#gone + 1] = ARGV[i]
  end
  local claim = redis.call('HGET', owners, ARGV[i])
  local claimant, claim_origin = claim and string.match(claim, '^%d+|([^|]*)|(.*)$')
  if claim_origin == origin then
    redis.call('HSET', owners, ARGV[i], now .. '|' .. claimant .. '|')
    redis.call('PEXPIRE', owners, timeout)
  end
end
return gone
