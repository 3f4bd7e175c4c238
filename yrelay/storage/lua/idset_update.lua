-- Add ids to, or remove them from, a reconciliation id set, and keep its
-- digest (count + XOR of xxh3_128) exact in the same step.
--
-- KEYS[1] members (sorted set, every score 0: ordered by id)
-- KEYS[2] digest (hash: count, hash = 32 lowercase hex digits)
-- ARGV[1] 'add' or 'remove'; then pairs: id, its xxh3_128 as 32 hex digits
--
-- Only ids that really join or leave the set are XORed: a repeated add, a
-- duplicate in one call or a remove of an absent id changes nothing, so no
-- hash is ever counted twice (XOR would cancel it).
-- Returns {ids changed, new count, new hash}.
local members, digest = KEYS[1], KEYS[2]
local adding = ARGV[1] == 'add'
local changed, delta = 0, ZERO_HASH
for i = 2, #ARGV, 2 do
  local done
  if adding then
    done = redis.call('ZADD', members, 0, ARGV[i])
  else
    done = redis.call('ZREM', members, ARGV[i])
  end
  if done == 1 then
    changed = changed + 1
    delta = xor_hex(delta, ARGV[i + 1])
  end
end
local state = redis.call('HMGET', digest, 'count', 'hash')
local count, hash = tonumber(state[1] or '0'), state[2] or ZERO_HASH
if changed > 0 then
  if adding then count = count + changed else count = count - changed end
  hash = xor_hex(hash, delta)
  if count == 0 then
    redis.call('DEL', digest)  -- an empty set leaves no key behind
  else
    redis.call('HSET', digest, 'count', count, 'hash', hash)
  end
end
return {changed, count, hash}
