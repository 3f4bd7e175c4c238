-- Hand claimed documents back to the due set after a collection.
--
-- KEYS[1] the bucket of the due set the documents were claimed from
-- ARGV[1] the lease score of the claim, ARGV[2] next due time (ms from now)
-- ARGV[3..] pairs: document, 'drop' (nothing left to collect) or 'keep'
--
-- Only documents still holding this claim's lease are touched: one that was
-- appended to meanwhile (score reset to 0) stays due for the next pass.
local due, lease = KEYS[1], ARGV[1]
local next_due = string.format('%.0f', now_ms() + tonumber(ARGV[2]))
local released = 0
for i = 3, #ARGV, 2 do
  local doc = ARGV[i]
  local score = redis.call('ZSCORE', due, doc)
  if score and string.format('%.0f', tonumber(score)) == lease then
    if ARGV[i + 1] == 'drop' then
      redis.call('ZREM', due, doc)
    else
      redis.call('ZADD', due, next_due, doc)
    end
    released = released + 1
  end
end
return released
