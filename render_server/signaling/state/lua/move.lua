-- Move session ARGV[4], held by worker ARGV[5], to another fitting, non-draining worker: a claim
-- there (the old claim stays in ARGV[5]'s set), or, with no free slot that fits, a queue entry
-- ahead of every arrival (score: now - 10^15 µs). Owner ARGV[6] ("" keeps it), lease ARGV[7] µs.
-- {'claim', worker} | {'queued', position, score} | {'parked', score} | {'none'}.
local done = replay() if done then return done end
local session, from = ARGV[4], ARGV[5]
if redis.call('HGET', K_HOLDER, session) ~= from then return {'none'} end
local t = now_us()
local owner = ARGV[6]
if owner == '' then owner = redis.call('HGET', K_OWNER, session) or '' end
set_lease(session, owner, t + tonumber(ARGV[7]))
local score = redis.call('ZSCORE', K_QUEUE, session)
if score then return {'queued', redis.call('ZRANK', K_QUEUE, session) + 1, score} end
score = redis.call('ZSCORE', K_PARKED, session)
if score then return {'parked', score} end
local req = requirements(redis.call('HGET', K_WANTS, session))
local w = best(free_workers(), req, as_set(holders_of(session)))
if w then
  claim(session, w, t)
  return remember({'claim', w.id})
end
score = int(t - 1000000000000000)
redis.call('ZADD', K_QUEUE, score, session)
return remember({'queued', redis.call('ZRANK', K_QUEUE, session) + 1, score})
