-- Free every claim, and drop every queue or park entry, whose lease has ended; serve the queue.
-- {{session, worker, ...released}, {dropped sessions}, {session, worker, ...served}}.
local done = replay() if done then return done end
local t = now_us()
local released, dropped = {}, {}
for _, session in ipairs(redis.call('ZRANGEBYSCORE', K_LEASE, '-inf', int(t))) do
  for _, w in ipairs(holders_of(session)) do
    unclaim(session, w)
    released[#released + 1] = session
    released[#released + 1] = w
  end
  if unqueue(session) then dropped[#dropped + 1] = session end
  forget_if_gone(session)
end
local served = {}
if #released > 0 then served = serve(t) end
if #released + #dropped == 0 then return {{}, {}, {}} end
return remember({released, dropped, served})
