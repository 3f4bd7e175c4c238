-- Claim documents whose GC is due, for one collector, for a while.
--
-- KEYS[1] one bucket of the due set (member = document, score = due time in ms; 0 = changed)
-- ARGV[1] how many, ARGV[2] lease (ms)
--
-- Claimed documents are pushed to now + lease: another process's pass skips
-- them, and if this collector dies they come due again when the lease ends.
-- An append meanwhile resets the score to 0, which is how the release below
-- knows the document changed while it was being collected.
-- Returns {lease score, doc, doc, ...}.
local due = KEYS[1]
local now = now_ms()
local lease = string.format('%.0f', now + tonumber(ARGV[2]))
local docs = redis.call('ZRANGEBYSCORE', due, '-inf', string.format('%.0f', now), 'LIMIT', 0, tonumber(ARGV[1]))
local result = {lease}
for _, doc in ipairs(docs) do
  redis.call('ZADD', due, lease, doc)
  result[#result + 1] = doc
end
return result
