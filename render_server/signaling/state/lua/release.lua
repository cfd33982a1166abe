-- Free session ARGV[5]'s slot on worker ARGV[4]; serve the queue.
local done = replay() if done then return done end
local id, session = ARGV[4], ARGV[5]
if redis.call('ZREM', SESSIONS .. id, session) == 0 then return {} end
redis.call('HDEL', K_HOLDER, session)
if redis.call('HINCRBY', K_USED, id, -1) < tonumber(redis.call('HGET', K_SLOTS, id)) then
  redis.call('ZADD', K_FREE, 0, id)
end
return remember(serve())
