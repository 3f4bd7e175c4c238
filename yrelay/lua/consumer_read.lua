-- After a member's XREAD, per document read (yrelay/consumers/reader.py).
--
-- KEYS[1] the document's group leases, KEYS[2] its meta
-- ARGV[1] group, ARGV[2] the member's assignment version, ARGV[3] the score
-- of the last entry read
--
-- Still the document's claimer (the fence holds our version): record how far
-- we read (<group>:out: a member that takes the document over counts what it
-- reads again up to there) and answer the trim mark, so a hole is never read
-- across. Claimed by another since: {'stale'}, and nothing written: what we
-- just read is not handed out.
-- Returns {'ok', trimmed_through or ''} | {'stale', ''}.
local leases, meta = KEYS[1], KEYS[2]
local group = ARGV[1]
if redis.call('HGET', leases, group) ~= ARGV[2] then return {'stale', ''} end
redis.call('HSET', leases, group .. ':out', ARGV[3])
return {'ok', redis.call('HGET', meta, 'trimmed_through') or ''}
