-- Session ARGV[4] ended: out of the queue or the park, every claim it holds released, the queue
-- served by the freed slots. {was waiting (0/1), the holder's worker or "", {the workers it was
-- moving away from}, {session, worker, ...served}}.
local done = replay() if done then return done end
local session = ARGV[4]
local waiting = unqueue(session) and 1 or 0
local holder = redis.call('HGET', K_HOLDER, session) or ''
local moved = moved_of(session)
if holder ~= '' then unclaim(session, holder) end
for _, w in ipairs(moved) do unclaim(session, w) end
forget_if_gone(session)
local served = {}
if holder ~= '' or #moved > 0 then served = serve(now_us()) end
return remember({waiting, holder, moved, served})
