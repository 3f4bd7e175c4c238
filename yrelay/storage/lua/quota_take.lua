-- Take up to `want` tokens from one subject's bucket, shared by every
-- server process (each takes a chunk and spends it locally).
-- KEYS[1] bucket hash (tokens, at); ARGV: rate per second, burst, want,
-- and optionally owe = 1: take all `want` even below zero (what was used
-- already: an answer's bytes, booked once sent), a debt later takes repay.
-- Returns {granted, ms until one token is back (0 when granted > 0)}.
local key = KEYS[1]
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local owe = ARGV[4] == '1'
local now = now_ms()
local saved = redis.call('HMGET', key, 'tokens', 'at')
local tokens, at = tonumber(saved[1]) or burst, tonumber(saved[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
local granted = want
if not owe then granted = math.max(0, math.min(want, math.floor(tokens))) end
tokens = tokens - granted
redis.call('HSET', key, 'tokens', tostring(tokens), 'at', string.format('%d', now))
redis.call('PEXPIRE', key, math.ceil((burst - math.min(tokens, 0)) / rate * 1000) + 1000)  -- full by then: forget it
if granted > 0 and tokens >= 0 then return {granted, 0} end
if granted > 0 then return {granted, math.ceil((1 - tokens) / rate * 1000)} end
return {0, math.max(1, math.ceil((1 - tokens) / rate * 1000))}
