-- Remove stream entries that a snapshot already holds, oldest first, and take
-- their ids out of the document's drift digest.
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] dedup
-- ARGV    pairs: id, the XOR of xxh3_128 over this id and every one before it
--         in ARGV, as 32 hex digits, for exactly the oldest entries of the
--         stream, in order (Lua cannot hash; the caller read the ids and
--         hashed them, and this script checks it read right). A running XOR,
--         so the script XORs once, with the one at the last hashed id: XORing
--         hex words per entry was most of its time, and Redis serves nobody
--         while a script runs.
--
-- Never trims past snapshot_offset: no path can delete an entry that is not
-- folded. trimmed_through moves in the same script as the XTRIM, so a reader
-- (which checks it in the same transaction as its XRANGE) can never step over
-- a hole unknowingly. The dedup fields of the removed entries go with them.
-- Returns {entries removed, last removed id}, {0, false} for nothing to do,
-- or {-1, false} when the stream does not start with the given ids.
local stream, meta, dedup = KEYS[1], KEYS[2], KEYS[3]
local n = #ARGV / 2
if n == 0 then return {0, false} end

local last = ARGV[2 * n - 1]
local folded = redis.call('HGET', meta, 'snapshot_offset') or '0-0'
if id_less(folded, last) then return {-1, false} end
local entries = redis.call('XRANGE', stream, '-', last, 'COUNT', n)
if #entries ~= n then return {-1, false} end
for i, entry in ipairs(entries) do
  if entry[1] ~= ARGV[2 * i - 1] then return {-1, false} end
end

local base, through, hash = digest_state(meta)
local dedup_fields, hashed = {}, 0
for i, entry in ipairs(entries) do
  local fields, session, clock = entry[2], nil, nil
  for j = 1, #fields, 2 do
    if fields[j] == 's' then session = fields[j + 1] elseif fields[j] == 'c' then clock = fields[j + 1] end
  end
  if session and clock then dedup_fields[#dedup_fields + 1] = session .. ':' .. clock end
  if not id_less(through, entry[1]) then hashed = i end
end
if #dedup_fields > 0 then redis.call('HDEL', dedup, unpack(dedup_fields)) end
if hashed > 0 then hash = xor_hex(hash, ARGV[2 * hashed]) end
-- Entries after `through` were never hashed; once they are gone the hashed
-- part starts after them (and `hash` is back to zero).
if id_less(through, last) then through = last end

local last_ms, last_seq = parse_id(last)
redis.call('XTRIM', stream, 'MINID', string.format('%.0f-%.0f', last_ms, last_seq + 1))
local previous = redis.call('HGET', meta, 'trimmed_through')
if not previous or id_less(previous, last) then
  redis.call('HSET', meta, 'trimmed_through', last)
end
redis.call('HSET', meta, 'digest_through', through, 'digest_hash', hash)
return {n, last}
