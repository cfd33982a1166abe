-- Claim a slot for session ARGV[4] (its requirements as JSON ARGV[5], "" for none), or queue it.
-- A retried request needs no kept reply: asked again, it answers the same claim or place.
local session, wants = ARGV[4], ARGV[5]
local held = redis.call('HGET', K_HOLDER, session)
if held then return {'claim', held} end
local rank = redis.call('ZRANK', K_QUEUE, session)
if rank then return {'queued', rank + 1} end
local w = best(free_workers(), requirements(wants))
if w then
  claim(session, w)
  return {'claim', w.id}
end
redis.call('ZADD', K_QUEUE, redis.call('INCR', K_SEQ), session)
redis.call('HSET', K_WANTS, session, wants)
return {'queued', redis.call('ZCARD', K_QUEUE)}
