-- A member acks what it processed of one document (yrelay/consumers/progress.py).
--
-- KEYS[1] the document's group leases, KEYS[2] its group progress
-- ARGV[1] group, ARGV[2] the member's assignment version, ARGV[3] offset score
--
-- Written only with the version of the latest claim: a member whose document
-- was claimed by another since is refused ('stale'). A group GC evicted has
-- no progress left ('evicted': it starts again from the snapshot). Progress
-- only moves forward.
local leases, progress = KEYS[1], KEYS[2]
local group, version = ARGV[1], ARGV[2]
if redis.call('HGET', leases, group) ~= version then return 'stale' end
if not redis.call('ZSCORE', progress, group) then return 'evicted' end
redis.call('ZADD', progress, 'GT', ARGV[3], group)
return 'ok'
