-- Parked session ARGV[4] back in the queue at its score; serve the queue (what it served).
local done = replay() if done then return done end
local session = ARGV[4]
local score = redis.call('ZSCORE', K_PARKED, session)
if not score then return {} end
redis.call('ZREM', K_PARKED, session)
redis.call('ZADD', K_QUEUE, score, session)
return remember(serve(now_us()))
