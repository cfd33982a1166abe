-- Add or replace worker ARGV[4] (its info as JSON ARGV[5], ARGV[6] slots); serve the queue.
local done = replay() if done then return done end
local id, info, slots = ARGV[4], ARGV[5], tonumber(ARGV[6])
local seen = now()
redis.call('HSET', K_WORKERS, id, info)
redis.call('HSET', K_SLOTS, id, slots)
if (tonumber(redis.call('HGET', K_USED, id)) or 0) < slots then
  redis.call('ZADD', K_FREE, 0, id)
else
  redis.call('ZREM', K_FREE, id)
end
if not redis.call('ZSCORE', K_ORDER, id) then
  redis.call('ZADD', K_ORDER, redis.call('INCR', K_SEQ), id)
end
redis.call('ZADD', K_SEEN, seen, id)
return remember(serve())
