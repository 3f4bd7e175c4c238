-- After a member's XREAD, per document read (yrelay/consumers/reader.py).
--
-- KEYS[1] the document's group leases, KEYS[2] its meta
-- ARGV[1] group, ARGV[2] the member's assignment version, ARGV[3] '' after a
-- read, or the score of the last entry about to be handed out
--
-- Still the document's claimer (the fence holds our version): answer the
-- trim mark, so a hole is never read across, and the document's newest id
-- (its lag, in the consumer_ack event). Before a hand-out, record how far
-- the application was given entries (<group>:out: a member that takes the
-- document over counts what it reads again up to there).
-- Claimed by another since: {'stale'}, and nothing written: what we just
-- read is not handed out.
-- Returns {'ok', trimmed_through or '', last_id or ''} | {'stale', '', ''}.
local leases, meta = KEYS[1], KEYS[2]
local group = ARGV[1]
if redis.call('HGET', leases, group) ~= ARGV[2] then return {'stale', '', ''} end
if ARGV[3] ~= '' then redis.call('HSET', leases, group .. ':out', ARGV[3]) end
local marks = redis.call('HMGET', meta, 'trimmed_through', 'last_id')
return {'ok', marks[1] or '', marks[2] or ''}
