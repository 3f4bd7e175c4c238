-- Append a batch of client updates to one document's stream, atomically.
--
-- KEYS[1] stream, KEYS[2] meta hash, KEYS[3] dedup hash
-- ARGV    triplets: session, clock, update bytes
-- Returns one {stream id, duplicate 0/1} pair per triplet, in order.
--
-- Ids are chosen here, never by Redis, so that the sequence part never
-- exceeds 999 (see yrelay/offsets.py: next_stream_id, which this mirrors):
-- the tracker score ms * 1000 + seq then stays exact and ordered.
-- A (session, clock) pair already appended is answered with its original id.
local stream, meta, dedup = KEYS[1], KEYS[2], KEYS[3]
local MAX_SEQ = 999

local now = now_ms()

local last_ms, last_seq = -1, 0
local last = redis.call('HGET', meta, 'last_id')
if last then
  last_ms, last_seq = parse_id(last)
end

local result = {}
local appended = false
for i = 1, #ARGV, 3 do
  local field = ARGV[i] .. ':' .. ARGV[i + 1]
  local previous = redis.call('HGET', dedup, field)
  if previous then
    result[#result + 1] = {previous, 1}
  else
    if now > last_ms then
      last_ms, last_seq = now, 0
    elseif last_seq < MAX_SEQ then
      last_seq = last_seq + 1
    else
      last_ms, last_seq = last_ms + 1, 0
    end
    local id = string.format('%d-%d', last_ms, last_seq)
    redis.call('XADD', stream, id, 'u', ARGV[i + 2], 's', ARGV[i], 'c', ARGV[i + 1])
    redis.call('HSET', dedup, field, id)
    result[#result + 1] = {id, 0}
    appended = true
  end
end
if appended then
  redis.call('HSET', meta, 'last_id', string.format('%d-%d', last_ms, last_seq))
end
return result
