-- Note worker ARGV[4] alive, its load ARGV[5]: 1, or 0 if it is unknown (expired).
local id, load = ARGV[4], ARGV[5]
if redis.call('HEXISTS', K_WORKERS, id) == 0 then return 0 end
local seen = now()
redis.call('ZADD', K_SEEN, seen, id)
redis.call('HSET', K_LOAD, id, load)
return 1
