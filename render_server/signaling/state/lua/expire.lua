-- Forget the workers not seen for ARGV[4] seconds: {{worker, {its sessions}}, ...}.
local done = replay() if done then return done end
local _, seconds = now()
local cutoff = seconds - tonumber(ARGV[4])
local stale = redis.call('ZRANGEBYSCORE', K_SEEN, '-inf', '(' .. string.format('%.17g', cutoff))
local out = {}
for _, id in ipairs(stale) do out[#out + 1] = {id, drop(id)} end
return remember(out)
