-- Fold newly hashed entries into a document's drift digest (compare-and-set).
--
-- KEYS[1] meta
-- ARGV[1..3] the base, through and hash the caller read; ARGV[4] new through,
-- ARGV[5] new hash (the caller XORed in the ids of (through, new through]).
-- Applied only if nothing moved since the read: a trim in between changes the
-- base or the hash, and the caller's sum would no longer be right.
-- Returns 1 when applied, 0 on a conflict.
local meta = KEYS[1]
local base, through, hash = digest_state(meta)
if base ~= ARGV[1] or through ~= ARGV[2] or hash ~= ARGV[3] then return 0 end
if id_less(ARGV[4], through) then return 0 end
redis.call('HSET', meta, 'digest_through', ARGV[4], 'digest_hash', ARGV[5])
return 1
