-- Forget worker ARGV[4]: the sessions it held.
local done = replay() if done then return done end
return remember(drop(ARGV[4]))
