-- Append a batch of client updates to one document's stream, atomically,
-- each only if the document can apply it (causal admission, see
-- yrelay/admission.py and docs/protocol.md#causal-admission).
--
-- KEYS[1] stream, KEYS[2] meta hash, KEYS[3] dedup hash, KEYS[4] clocks hash
-- ARGV[1] the caller's layout version; then per update:
--   session, clock, update bytes,
--   n, then n triplets (yjs client, start, end): struct ranges in clock order,
--   m, then m pairs (yjs client, highest clock referred to).
-- Returns one reply per update, in order:
--   {stream id, 0}          appended
--   {stream id, 1}          a (session, clock) already appended: its original id
--   {'', 2, lacking, state} refused: `lacking` and `state` are flat
--                           (client, document clock) lists: the clients whose
--                           content it lacks, and every client it involves.
-- or {'stale'} for the whole batch when the clocks hash does not account for
-- every entry yet (written by a server from before admission): the caller
-- brings it up to date (yrelay/clocks.py) and tries again.
--
-- Ids are chosen here, never by Redis, so that the sequence part never
-- exceeds 999 (see yrelay/offsets.py: next_stream_id, which this mirrors):
-- the tracker score ms * 1000 + seq then stays exact and ordered.
local stream, meta, dedup, clocks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local LAYOUT = 2
local MAX_SEQ = 999

local state = redis.call('HMGET', meta, 'last_id', 'clocks_through', 'layout')
if state[3] and tonumber(state[3]) > LAYOUT then
  return redis.error_reply('YRELAY_LAYOUT document layout ' .. state[3] .. ' is newer than this server knows')
end
if tonumber(ARGV[1]) ~= LAYOUT then
  return redis.error_reply('YRELAY_LAYOUT the caller speaks layout ' .. ARGV[1] .. ', this script ' .. LAYOUT)
end
if redis.call('HEXISTS', meta, 'deleted') == 1 then
  -- A tombstone (delete_document.lua): nothing is written until it expires.
  return redis.error_reply('YRELAY_DELETED the document was deleted')
end
local last = state[1]
if last and state[2] ~= last then
  return {'stale'}
end

local now = now_ms()
local last_ms, last_seq = -1, 0
if last then
  last_ms, last_seq = parse_id(last)
end

-- The document's clocks, read once per client and kept for the batch.
local known = {}
local function clock_of(client)
  local value = known[client]
  if value == nil then
    value = tonumber(redis.call('HGET', clocks, client) or '0')
    known[client] = value
  end
  return value
end

-- Check one update; returns the clocks it moves, or nil and the lacking clients.
local function admit(at, ranges, refs)
  local after, lacking, involved = {}, {}, {}
  local function current(client)
    involved[client] = true
    local value = after[client]
    if value == nil then value = clock_of(client) end
    return value
  end
  for r = 0, ranges - 1 do
    local client = ARGV[at + 3 * r]
    local start, stop = tonumber(ARGV[at + 3 * r + 1]), tonumber(ARGV[at + 3 * r + 2])
    local held = current(client)
    if start > held then
      lacking[client] = true
    elseif stop > held and not lacking[client] then
      after[client] = stop
    end
  end
  local refs_at = at + 3 * ranges + 1
  for r = 0, refs - 1 do
    local client, clock = ARGV[refs_at + 2 * r], tonumber(ARGV[refs_at + 2 * r + 1])
    if clock >= current(client) then lacking[client] = true end
  end
  if next(lacking) == nil then return after end
  local lacking_flat, state_flat = {}, {}
  for client in pairs(lacking) do
    lacking_flat[#lacking_flat + 1] = client
    lacking_flat[#lacking_flat + 1] = tostring(clock_of(client))
  end
  for client in pairs(involved) do
    state_flat[#state_flat + 1] = client
    state_flat[#state_flat + 1] = tostring(clock_of(client))
  end
  return nil, lacking_flat, state_flat
end

local result, moved = {}, {}
local appended = false
local i = 2
while i <= #ARGV do
  local session, clock, update = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ranges = tonumber(ARGV[i + 3])
  local refs_at = i + 4 + 3 * ranges
  local refs = tonumber(ARGV[refs_at])
  local field = session .. ':' .. clock
  local previous = redis.call('HGET', dedup, field)
  if previous then
    result[#result + 1] = {previous, 1}
  else
    local after, lacking_flat, state_flat = admit(i + 4, ranges, refs)
    if after == nil then
      result[#result + 1] = {'', 2, lacking_flat, state_flat}
    else
      if now > last_ms then
        last_ms, last_seq = now, 0
      elseif last_seq < MAX_SEQ then
        last_seq = last_seq + 1
      else
        last_ms, last_seq = last_ms + 1, 0
      end
      local id = string.format('%d-%d', last_ms, last_seq)
      redis.call('XADD', stream, id, 'u', update, 's', session, 'c', clock)
      redis.call('HSET', dedup, field, id)
      for client, value in pairs(after) do
        known[client] = value
        moved[client] = true
      end
      result[#result + 1] = {id, 0}
      appended = true
    end
  end
  i = refs_at + 1 + 2 * refs
end
for client in pairs(moved) do
  redis.call('HSET', clocks, client, string.format('%d', known[client]))
end
if appended then
  local id = string.format('%d-%d', last_ms, last_seq)
  redis.call('HSET', meta, 'last_id', id, 'clocks_through', id, 'layout', LAYOUT)
end
return result
