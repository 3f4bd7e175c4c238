-- Store the awareness entries one connection sent for a document, unless
-- (nothing is stored then):
-- - a clientID among them is claimed by another owner within the timeout
--   (spoofing, or taking the clientID of a user who just left): returns
--   {'owner', clientIDs...};
-- - it would bring the document past max_clients claimed clientIDs:
--   returns {'full', claimed}.
-- Otherwise returns {}.
-- KEYS[1] presence hash, KEYS[2] owners hash; ARGV: session, origin, owner,
-- timeout_ms, max_clients, then pairs of clientID and encoded entry ('' =
-- the client removed its state).
-- Presence values are '<ms>|<session>|<origin>|<encoded entry>'; owners
-- values '<ms>|<owner>|<origin>'. An owner is a subject (or a client address
-- when auth is off): its connections and sessions may take each other's
-- clientIDs over (a browser reconnecting before the server saw its old
-- socket die, or after a server restart).
local key, owners = KEYS[1], KEYS[2]
local session, origin, owner = ARGV[1], ARGV[2], ARGV[3]
local timeout, max_clients = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()

local function fresh(value)  -- HGET answers false for a missing field
  local at = value and tonumber(string.match(value, '^(%d+)|'))
  return at and at + timeout > now
end

local function claimed_by_other(value)
  return fresh(value) and string.match(value, '^%d+|([^|]*)|') ~= owner
end

local refused, new = {'owner'}, 0
for i = 6, #ARGV, 2 do
  local claim = redis.call('HGET', owners, ARGV[i])
  if claimed_by_other(claim) then
    refused[#refused + 1] = ARGV[i]
  elseif not claim then
    new = new + 1
  end
end
if #refused > 1 then return refused end

if new > 0 and redis.call('HLEN', owners) + new > max_clients then
  local fields = redis.call('HGETALL', owners)  -- at most max_clients: drop the stale claims first
  for i = 1, #fields, 2 do
    if not fresh(fields[i + 1]) then redis.call('HDEL', owners, fields[i]) end
  end
  local claimed = redis.call('HLEN', owners)
  if claimed + new > max_clients then return {'full', claimed} end
end

local prefix = string.format('%d', now) .. '|' .. session .. '|' .. origin .. '|'
local claim = string.format('%d', now) .. '|' .. owner .. '|' .. origin
for i = 6, #ARGV, 2 do
  redis.call('HSET', owners, ARGV[i], claim)
  if ARGV[i + 1] == '' then
    redis.call('HDEL', key, ARGV[i])
  else
    redis.call('HSET', key, ARGV[i], prefix .. ARGV[i + 1])
  end
end
redis.call('PEXPIRE', owners, timeout)
if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, timeout) end
return {}
