-- Forget worker ARGV[4]: the sessions it was the holder of.
local done = replay() if done then return done end
return remember(drop(ARGV[4]))
