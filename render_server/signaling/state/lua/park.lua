-- Park waiting session ARGV[4] (its place kept, skipped by serving): 1 if it is parked now, 0 if
-- it was not waiting. Serves nobody: the free slots fit no waiting request before or after.
local session = ARGV[4]
if redis.call('ZSCORE', K_PARKED, session) then return 1 end
local score = redis.call('ZSCORE', K_QUEUE, session)
if not score then return 0 end
redis.call('ZREM', K_QUEUE, session)
redis.call('ZADD', K_PARKED, score, session)
return 1
