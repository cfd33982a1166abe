-- Free session ARGV[5]'s slot on worker ARGV[4] (if it is in its set; the holder index changes
-- only if that worker is the holder); serve the queue.
local done = replay() if done then return done end
local id, session = ARGV[4], ARGV[5]
if not unclaim(session, id) then return {} end
forget_if_gone(session)
return remember(serve(now_us()))
