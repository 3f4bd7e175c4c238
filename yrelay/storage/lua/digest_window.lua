-- Everything needed to compute a document's drift digest over a client's
-- window (since, offset], read in one atomic step. Hashing happens in Python
-- (Redis Lua has no xxh3): this script only returns the ids to hash.
--
-- KEYS[1] stream, KEYS[2] meta
-- ARGV[1] since, ARGV[2] offset, ARGV[3] at most this many ids in all,
-- ARGV[4] through (>= offset), ARGV[5] the client's session
-- Returns {base, through, hash, last_id, length, unhashed, below, above, own, complete}:
--   unhashed = ids in (through, last]   (not in `hash` yet)
--   below    = ids in (base, since]     (held by the server, outside the window)
--   above    = ids in (offset, last]    (after the client's offset)
--   own      = ids in (offset, through] appended by the session (the client holds them)
--   complete = 0 when a list was cut at the cap (the caller cannot compute)
local stream, meta = KEYS[1], KEYS[2]
local since, offset, cap = ARGV[1], ARGV[2], tonumber(ARGV[3])
local client_through, session = ARGV[4], ARGV[5]

local base, through, hash = digest_state(meta)
local last = redis.call('HGET', meta, 'last_id') or '0-0'
local length = redis.call('XLEN', stream)
local complete = 1

local function sent_by(entry, who)
  local fields = entry[2]
  for j = 1, #fields, 2 do
    if fields[j] == 's' then return fields[j + 1] == who end
  end
  return false
end

-- Ids in (low, high], of entries `who` sent if given; within the cap.
local function ids(low, high, who)
  if not id_less(low, high) or cap < 0 then return {} end
  local entries = redis.call('XRANGE', stream, '(' .. low, high, 'COUNT', cap + 1)
  if #entries > cap then
    complete = 0
  end
  local result = {}
  for i = 1, math.min(#entries, cap) do
    if not who or sent_by(entries[i], who) then result[#result + 1] = entries[i][1] end
  end
  cap = cap - math.min(#entries, cap)
  return result
end

local unhashed = ids(through, last)
local below = {}
if id_less(base, since) then below = ids(base, since) end
local above = ids(offset, last)
local own = ids(offset, client_through, session)
return {base, through, hash, last, length, unhashed, below, above, own, complete}
