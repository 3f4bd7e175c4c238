-- A member starts on a document it was assigned (yrelay/consumers/progress.py).
--
-- KEYS[1] the document's group leases, KEYS[2] its group progress, KEYS[3] meta
-- ARGV[1] group, ARGV[2] the member's assignment version
--
-- Versions only grow: a claim with an older version than the one stored is
-- a member whose document was given to another since (stale), and changes
-- nothing. A group with no progress on the document (new, or evicted by GC)
-- starts from the snapshot, and its position is recorded at the snapshot
-- offset so GC holds the stream back from there on.
-- On resume, also the score through which the previous reader of the
-- document (<group>:out, written as it reads) had read: what lies between
-- the resume score and it is handed out a second time (the redelivery count).
-- Returns {'stale', stored version} | {'resume', score, evicted flag, out score or ''}
--       | {'snapshot', snapshot offset, evicted flag}.
local leases, progress, meta = KEYS[1], KEYS[2], KEYS[3]
local group, version = ARGV[1], tonumber(ARGV[2])
local current = tonumber(redis.call('HGET', leases, group) or '0')
if version < current then return {'stale', current} end
redis.call('HSET', leases, group, ARGV[2])
local evicted = redis.call('HDEL', leases, group .. ':evicted')
local score = redis.call('ZSCORE', progress, group)
if score then return {'resume', score, evicted, redis.call('HGET', leases, group .. ':out') or ''} end
local snapshot = redis.call('HGET', meta, 'snapshot_offset') or '0-0'
redis.call('ZADD', progress, string.format('%.0f', id_score(snapshot)), group)
return {'snapshot', snapshot, evicted}
