-- Evict lagging sessions from one document's tracker (ZREMRANGEBYSCORE).
--
-- KEYS[1] tracker, KEYS[2] stream, KEYS[3] meta
-- ARGV[1] relative delta (ms), ARGV[2] absolute delta (ms),
-- ARGV[3] 1 = dry run (report only), ARGV[4] how many evicted names to return
--
-- A session is "behind by D" when the stream still holds an entry it has not
-- acked that is D older than the reference time. Measuring from entries, not
-- from raw score differences, keeps a session that acked everything before a
-- quiet hour from looking an hour behind when the next edit lands.
--   cutoff(T) = score of the newest entry with time <= T;
--   sessions scoring below cutoff(T) lack an entry from before T.
-- Relative: T = leader time - R, while some session is healthy (not behind
-- now - A); it never evicts the leader. Absolute: T = now - A, when none is.
-- Returns {mode, evicted count, names, min score left or false,
--          leader score or false, last_id, snapshot_offset, trimmed_through}.
local tracker, stream, meta = KEYS[1], KEYS[2], KEYS[3]
local relative_ms, absolute_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local dry_run, max_names = ARGV[3] == '1', tonumber(ARGV[4])

local function cutoff(t_ms) return stream_cutoff(stream, t_ms) end

local meta_fields = redis.call('HMGET', meta, 'last_id', 'snapshot_offset', 'trimmed_through')
local leader = redis.call('ZREVRANGE', tracker, 0, 0, 'WITHSCORES')
if #leader == 0 then
  return {'none', 0, {}, false, false, meta_fields[1], meta_fields[2], meta_fields[3]}
end
local leader_score = tonumber(leader[2])
local now = now_ms()

local mode, cut = 'relative', nil
local absolute_cut = cutoff(now - absolute_ms)
if absolute_cut ~= nil and leader_score < absolute_cut then
  mode, cut = 'absolute', absolute_cut
else
  cut = cutoff(math.floor(leader_score / 1000) - relative_ms)
end

local evicted, names = 0, {}
if cut ~= nil then
  local below = '(' .. string.format('%.0f', cut)
  evicted = redis.call('ZCOUNT', tracker, '-inf', below)
  if evicted > 0 then
    names = redis.call('ZRANGEBYSCORE', tracker, '-inf', below, 'LIMIT', 0, max_names)
    if not dry_run then
      redis.call('ZREMRANGEBYSCORE', tracker, '-inf', below)
    end
  end
end

local lowest
if dry_run and cut ~= nil then
  lowest = redis.call('ZRANGEBYSCORE', tracker, string.format('%.0f', cut), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
else
  lowest = redis.call('ZRANGE', tracker, 0, 0, 'WITHSCORES')
end
local min_score = false
if #lowest > 0 then min_score = lowest[2] end
return {mode, evicted, names, min_score, leader[2], meta_fields[1], meta_fields[2], meta_fields[3]}
