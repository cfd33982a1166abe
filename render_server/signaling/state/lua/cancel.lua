-- Take waiting (queued or parked) session ARGV[4] out: {1}, or {0} if it was not waiting. A
-- claim it holds stays (see withdraw.lua).
local done = replay() if done then return done end
local waiting = unqueue(ARGV[4])
forget_if_gone(ARGV[4])
if not waiting then return {0} end
return remember({1})
