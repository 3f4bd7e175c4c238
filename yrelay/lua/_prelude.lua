-- Helpers shared by every yrelay script; yrelay/scripts.py prepends this file.
-- Stream ids are 'ms-seq' strings; scores are ms * 1000 + seq (exact: seq <= 999).
local function parse_id(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end

local function id_less(a, b)
  local a_ms, a_seq = parse_id(a)
  local b_ms, b_seq = parse_id(b)
  return a_ms < b_ms or (a_ms == b_ms and a_seq < b_seq)
end

local function id_score(id)
  local ms, seq = parse_id(id)
  return ms * 1000 + seq
end

-- Redis's clock, in milliseconds: one clock for every process.
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
