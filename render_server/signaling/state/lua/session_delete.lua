-- Forget a session (ARGV[1]): its record (KEYS[1]) and its places in its subject's (KEYS[2])
-- and its address's (KEYS[3]) counts.
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 0
