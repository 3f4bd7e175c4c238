-- Store a new snapshot of one document, if nobody else did meanwhile.
--
-- KEYS[1] meta, KEYS[2] snapshot
-- ARGV[1] the snapshot offset the fold started from ('0-0' for none),
-- ARGV[2] the offset the new snapshot covers, ARGV[3] the snapshot bytes
--
-- Compare-and-set on snapshot_offset: two collectors that folded from the same
-- snapshot cannot both win, so no entry is folded twice into diverging
-- snapshots and no snapshot ever moves backwards.
-- Returns {1, new offset} when stored, {0, current offset} when not.
local meta, snapshot = KEYS[1], KEYS[2]
local expected, covers = ARGV[1], ARGV[2]

local current = redis.call('HGET', meta, 'snapshot_offset') or '0-0'
if current ~= expected then return {0, current} end
if not id_less(current, covers) then return {0, current} end
redis.call('SET', snapshot, ARGV[3])
redis.call('HSET', meta, 'snapshot_offset', covers)
return {1, covers}
