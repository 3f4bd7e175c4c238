-- A live owner releases a document the leader is handing over
-- (yrelay/consumers/handover.py): the second step of a two-step handover.
--
-- KEYS[1] assignment, KEYS[2] handover, KEYS[3] meta
-- ARGV[1] document, ARGV[2] the owner's member id, ARGV[3] its version
--
-- The owner acked everything it handed out (or dropped what it had not
-- handed out yet) and reads the document no more; the document now goes to
-- the member and version the leader chose. Refused (0) when the owner no
-- longer holds the document with that version, or the handover was
-- cancelled meanwhile. Returns 1 when the document moved.
local assignment, handover, meta = KEYS[1], KEYS[2], KEYS[3]
local doc = ARGV[1]
if redis.call('HGET', assignment, doc) ~= ARGV[2] .. '|' .. ARGV[3] then return 0 end
local pending = redis.call('HGET', handover, doc)
if not pending then return 0 end
local target, version = string.match(pending, '^(.*)|(%d+)|%d+$')
redis.call('HSET', assignment, doc, target .. '|' .. version)
redis.call('HDEL', handover, doc)
redis.call('HINCRBY', meta, 'rev', 1)
redis.call('HINCRBY', meta, 'handovers', 1)
return 1
