-- Store the awareness entries one connection sent for a document, unless a
-- clientID among them belongs to another live connection (spoofing): then
-- store nothing and return the refused clientIDs.
-- KEYS[1] presence hash; ARGV: session, origin, timeout_ms, then pairs of
-- clientID and encoded entry ('' = the client removed its state).
-- Field values are '<ms>|<session>|<origin>|<encoded entry>'.
local key, session, origin, timeout = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()

-- Owned by another session's connection that renewed it within the timeout.
-- The same session may take a clientID over (a browser reconnecting before
-- the server noticed its old connection died).
local function owned_elsewhere(value)
  if not value then return false end
  local at, owner_session, owner = string.match(value, '^(%d+)|([^|]*)|([^|]*)|')
  if not at or owner == origin or owner_session == session then return false end
  return tonumber(at) + timeout > now
end

local refused = {}
for i = 4, #ARGV, 2 do
  if owned_elsewhere(redis.call('HGET', key, ARGV[i])) then refused[#refused + 1] = ARGV[i] end
end
if #refused > 0 then return refused end

local prefix = string.format('%d', now) .. '|' .. session .. '|' .. origin .. '|'
for i = 4, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', key, ARGV[i])
  else
    redis.call('HSET', key, ARGV[i], prefix .. ARGV[i + 1])
  end
end
if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, timeout) end
return refused
