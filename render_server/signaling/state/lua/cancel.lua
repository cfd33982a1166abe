-- Take waiting session ARGV[4] out of the queue: {1}, or {0} if it was not waiting.
local done = replay() if done then return done end
if redis.call('ZREM', K_QUEUE, ARGV[4]) == 0 then return {0} end
redis.call('HDEL', K_WANTS, ARGV[4])
return remember({1})
