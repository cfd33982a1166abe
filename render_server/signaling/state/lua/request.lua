-- Claim a slot for session ARGV[4] (its requirements as JSON ARGV[5], "" for none), or queue it.
-- With ARGV[6] = "1" a request that no registered worker fits, free or busy, is refused instead
-- ({'unservable', 0}); with no worker registered at all it queues (a fleet scaling up from zero).
-- A retried request needs no kept reply: asked again, it answers the same claim or place.
local session, wants = ARGV[4], ARGV[5]
local held = redis.call('HGET', K_HOLDER, session)
if held then return {'claim', held} end
local rank = redis.call('ZRANK', K_QUEUE, session)
if rank then return {'queued', rank + 1} end
local req = requirements(wants)
local w = best(free_workers(), req)
if w then
  claim(session, w)
  return {'claim', w.id}
end
if ARGV[6] == '1' and req ~= nil then
  local infos = redis.call('HVALS', K_WORKERS)
  local servable = #infos == 0
  for _, text in ipairs(infos) do
    if fits(req, cjson.decode(text)) then servable = true break end
  end
  if not servable then return {'unservable', 0} end
end
redis.call('ZADD', K_QUEUE, redis.call('INCR', K_SEQ), session)
redis.call('HSET', K_WANTS, session, wants)
return {'queued', redis.call('ZCARD', K_QUEUE)}
