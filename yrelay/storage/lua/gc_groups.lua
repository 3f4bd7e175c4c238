-- Evict lagging consumer groups from one document (yrelay/gc/groups.py).
--
-- KEYS[1] the document's group progress, KEYS[2] stream, KEYS[3] group leases
-- ARGV[1] abandoned delta (ms), ARGV[2] live absolute delta (ms),
-- ARGV[3] 1 = dry run, ARGV[4..] the groups with a live member
--
-- Behind as in gc_evict.lua (lacking an entry older than T). An abandoned
-- group (not listed live): T = the newest entry's time - abandoned delta.
-- A live group: T = now - absolute delta. An evicted group loses its
-- progress (its next claim or ack starts it again from the snapshot) and
-- is flagged so its members are told why.
-- Returns {evicted names, lowest score left or false}.
local progress, stream, leases = KEYS[1], KEYS[2], KEYS[3]
local abandoned_ms, absolute_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local dry_run = ARGV[3] == '1'
local live = {}
for i = 4, #ARGV do live[ARGV[i]] = true end

local function cutoff(t_ms) return stream_cutoff(stream, t_ms) end

local head = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
local evicted = {}
if #head > 0 then
  local head_ms = parse_id(head[1][1])
  local abandoned_cut = cutoff(head_ms - abandoned_ms)
  local live_cut = cutoff(now_ms() - absolute_ms)
  local rows = redis.call('ZRANGE', progress, 0, -1, 'WITHSCORES')
  for i = 1, #rows, 2 do
    local group, score = rows[i], tonumber(rows[i + 1])
    local cut = abandoned_cut
    if live[group] then cut = live_cut end
    if cut ~= nil and score < cut then
      evicted[#evicted + 1] = group
      if not dry_run then
        redis.call('ZREM', progress, group)
        redis.call('HSET', leases, group .. ':evicted', 1)
      end
    end
  end
end
local lowest = false
if dry_run then
  local gone = {}
  for _, group in ipairs(evicted) do gone[group] = true end
  local rows = redis.call('ZRANGE', progress, 0, -1, 'WITHSCORES')
  for i = 1, #rows, 2 do
    if not gone[rows[i]] then lowest = rows[i + 1]; break end
  end
else
  local rows = redis.call('ZRANGE', progress, 0, 0, 'WITHSCORES')
  if #rows > 0 then lowest = rows[2] end
end
return {evicted, lowest}
