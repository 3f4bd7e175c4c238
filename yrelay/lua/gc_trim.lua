-- Remove stream entries that a snapshot already holds, oldest first.
--
-- KEYS[1] stream, KEYS[2] meta, KEYS[3] dedup
-- ARGV[1] trim through this id (inclusive), ARGV[2] at most this many entries
--
-- Never trims past snapshot_offset, whatever the caller asks: no path can
-- delete an entry that is not folded. trimmed_through moves in the same
-- script as the XTRIM, so a reader (which checks it in the same transaction
-- as its XRANGE) can never step over a hole unknowingly. The dedup fields of
-- the removed entries go with them.
-- Returns {entries removed, last removed id or false}.
local stream, meta, dedup = KEYS[1], KEYS[2], KEYS[3]

local through = ARGV[1]
local folded = redis.call('HGET', meta, 'snapshot_offset') or '0-0'
if id_less(folded, through) then through = folded end

local entries = redis.call('XRANGE', stream, '-', through, 'COUNT', tonumber(ARGV[2]))
if #entries == 0 then return {0, false} end
for _, entry in ipairs(entries) do
  local fields, session, clock = entry[2], nil, nil
  for i = 1, #fields, 2 do
    if fields[i] == 's' then session = fields[i + 1] elseif fields[i] == 'c' then clock = fields[i + 1] end
  end
  if session and clock then redis.call('HDEL', dedup, session .. ':' .. clock) end
end
local last = entries[#entries][1]
local last_ms, last_seq = parse_id(last)
redis.call('XTRIM', stream, 'MINID', string.format('%.0f-%.0f', last_ms, last_seq + 1))
local previous = redis.call('HGET', meta, 'trimmed_through')
if not previous or id_less(previous, last) then
  redis.call('HSET', meta, 'trimmed_through', last)
end
return {#entries, last}
