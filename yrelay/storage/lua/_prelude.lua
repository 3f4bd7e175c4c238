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

-- The score of the newest entry of `stream` at or before T (ms), or nil:
-- whoever scores below it lacks an entry from before T (GC's eviction rules).
local function stream_cutoff(stream, t_ms)
  if t_ms < 0 then return nil end
  local newest = redis.call('XREVRANGE', stream, string.format('%.0f', t_ms), '-', 'COUNT', 1)
  if #newest == 0 then return nil end
  return id_score(newest[1][1])
end

-- 128-bit set hashes travel as 32 lowercase hex digits; XOR them as four
-- 32-bit words (Redis Lua numbers are doubles; the bit library is 32-bit).
local ZERO_HASH = string.rep('0', 32)

local function xor_hex(a, b)
  local words = {}
  for i = 1, 32, 8 do
    local x = tonumber(string.sub(a, i, i + 7), 16)
    local y = tonumber(string.sub(b, i, i + 7), 16)
    words[#words + 1] = bit.tohex(bit.bxor(x, y), 8)
  end
  return table.concat(words)
end

-- A document's drift digest (see yrelay/reconciliation/stream_digest.py):
-- digest_hash is the XOR of xxh3_128(id) over the stream entries with
-- base < id <= through, where base is trimmed_through. Entries after
-- `through` are in the stream but not hashed yet.
local function digest_state(meta)
  local state = redis.call('HMGET', meta, 'trimmed_through', 'digest_through', 'digest_hash')
  local base = state[1] or '0-0'
  local through = state[2] or base
  -- Nothing hashed above the base: the hash of an empty set, whatever is
  -- stored (a trim by an older server that did not maintain the digest).
  if not id_less(base, through) then return base, base, ZERO_HASH end
  return base, through, state[3] or ZERO_HASH
end
