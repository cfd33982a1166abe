-- Claim a slot for session ARGV[4] (its requirements as JSON ARGV[5], "" for none), or queue it
-- (at score ARGV[9] if not "", else now in µs). With ARGV[6] = "1" a request that no registered,
-- non-draining worker fits, free or busy, is refused instead ({'unservable'}); with none such
-- registered it queues (a fleet scaling up from zero). The claim or entry is owned by ARGV[7],
-- its lease ending ARGV[8] µs from now, also when asked again. A parked session asking again is
-- unparked. Replies {'claim', worker} or {'queued', position, score}.
-- A retried request needs no kept reply: asked again, it answers the same claim or place.
local session, wants, owner = ARGV[4], ARGV[5], ARGV[7]
local t = now_us()
local ends = t + tonumber(ARGV[8])
local held = redis.call('HGET', K_HOLDER, session)
if held then
  set_lease(session, owner, ends)
  return {'claim', held}
end
local parked = redis.call('ZSCORE', K_PARKED, session)
if parked then  -- its browser is back: its old place, or a slot now
  redis.call('ZREM', K_PARKED, session)
  redis.call('ZADD', K_QUEUE, parked, session)
  local req = requirements(redis.call('HGET', K_WANTS, session))
  local w = best(free_workers(), req, as_set(holders_of(session)))
  if w then
    redis.call('ZREM', K_QUEUE, session)
    claim(session, w, t)
    set_lease(session, owner, ends)
    return {'claim', w.id}
  end
end
local score = redis.call('ZSCORE', K_QUEUE, session)
if score then
  set_lease(session, owner, ends)
  return {'queued', redis.call('ZRANK', K_QUEUE, session) + 1, score}
end
local req = requirements(wants)
local w = best(free_workers(), req, as_set(holders_of(session)))
if w then
  claim(session, w, t)
  redis.call('HSET', K_WANTS, session, wants)
  set_lease(session, owner, ends)
  return {'claim', w.id}
end
if ARGV[6] == '1' and req ~= nil then
  local servable, active = false, 0
  local all = redis.call('HGETALL', K_WORKERS)
  for i = 1, #all, 2 do
    if redis.call('SISMEMBER', K_DRAINING, all[i]) == 0 then
      active = active + 1
      if fits(req, cjson.decode(all[i + 1])) then servable = true break end
    end
  end
  if active > 0 and not servable then return {'unservable'} end
end
score = ARGV[9]
if score == '' then score = int(t) end
redis.call('ZADD', K_QUEUE, score, session)
redis.call('HSET', K_WANTS, session, wants)
set_lease(session, owner, ends)
return {'queued', redis.call('ZRANK', K_QUEUE, session) + 1, score}
