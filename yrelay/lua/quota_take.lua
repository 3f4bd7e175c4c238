-- Take up to `want` tokens from one subject's bucket, shared by every
-- server process (each takes a chunk and spends it locally).
-- KEYS[1] bucket hash (tokens, at); ARGV: rate per second, burst, want.
-- Returns {granted, ms until one token is back (0 when granted > 0)}.
local key = KEYS[1]
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local saved = redis.call('HMGET', key, 'tokens', 'at')
local tokens, at = tonumber(saved[1]) or burst, tonumber(saved[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
local granted = math.min(want, math.floor(tokens))
tokens = tokens - granted
redis.call('HSET', key, 'tokens', tostring(tokens), 'at', string.format('%d', now))
redis.call('PEXPIRE', key, math.ceil(burst / rate * 1000) + 1000)  -- full again by then: forget it
if granted > 0 then return {granted, 0} end
return {0, math.max(1, math.ceil((1 - tokens) / rate * 1000))}
