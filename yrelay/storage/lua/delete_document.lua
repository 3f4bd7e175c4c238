-- Delete a document (yrelay/deletion.py), atomically on its slot.
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] tracker, KEYS[4] group progress,
-- KEYS[5] group leases, KEYS[6..] every other key of the document (deleted).
-- ARGV[1] the tombstone's lifetime (seconds), ARGV[2] the marker's session.
--
-- Everything goes but a tombstone: the stream holds one *deletion marker*
-- (an entry with an empty update and the session ARGV[2], an id after
-- every entry the document had), and meta says `deleted` = its id, with
-- `last_id` and `snapshot_offset` at it. So a subscriber or a consumer group
-- reading from any earlier position reads the marker next (and learns of the
-- deletion, from the fan-out's XREAD like any change), a new subscriber
-- starts after it (an empty document), and append.lua refuses every write
-- while meta says `deleted`: a write racing the delete cannot bring back half
-- a document. The groups' positions stay (they reach the marker from there).
-- The tombstone keys expire after ARGV[1] seconds: the id is then free again.
-- Returns {marker id, the sessions the tracker held}.
local stream, meta, tracker, progress, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ttl = tonumber(ARGV[1])
local last = redis.call('HGET', meta, 'last_id') or '0-0'
local deleted = redis.call('HGET', meta, 'deleted')
local sessions = redis.call('ZRANGE', tracker, 0, -1)
if deleted then
  return {deleted, sessions}
end
local now = now_ms()
local last_ms, last_seq = parse_id(last)
local id
if now > last_ms then id = string.format('%d-0', now) else id = string.format('%d-%d', last_ms + 1, 0) end
for i = 1, #KEYS do
  if i ~= 4 and i ~= 5 then redis.call('DEL', KEYS[i]) end
end
redis.call('XADD', stream, id, 'u', '', 's', ARGV[2], 'c', '0')
redis.call('HSET', meta, 'deleted', id, 'last_id', id, 'clocks_through', id, 'snapshot_offset', id,
           'layout', 2)
for _, key in ipairs({stream, meta, progress, leases}) do
  if redis.call('EXISTS', key) == 1 then redis.call('EXPIRE', key, ttl) end
end
return {id, sessions}
