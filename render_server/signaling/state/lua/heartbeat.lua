-- Note worker ARGV[4] alive, its load ARGV[5]. With ARGV[6] = "1", reconcile its set with the
-- sessions it serves (ARGV[8..]): those outside its set are stray, those of its set it does not
-- serve, claimed more than ARGV[7] µs ago, are freed (and the queue served).
-- {known (0/1), {stray}, {released sessions}, {session, worker, ...served}}.
local reconcile = ARGV[6] == '1'
if reconcile then
  local done = replay() if done then return done end
end
local id, load = ARGV[4], ARGV[5]
if redis.call('HEXISTS', K_WORKERS, id) == 0 then return {0, {}, {}, {}} end
local seen = now()
redis.call('ZADD', K_SEEN, seen, id)
redis.call('HSET', K_LOAD, id, load)
if not reconcile then return {1, {}, {}, {}} end
local t = now_us()
local key = SESSIONS .. id
local serves, stray = {}, {}
for i = 8, #ARGV do
  serves[ARGV[i]] = true
  if not redis.call('ZSCORE', key, ARGV[i]) then stray[#stray + 1] = ARGV[i] end
end
local cutoff = t - tonumber(ARGV[7])
local released = {}
for _, session in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  if not serves[session] then
    local at = tonumber(redis.call('HGET', CLAIMED .. id, session)) or 0
    if at < cutoff then
      unclaim(session, id)
      forget_if_gone(session)
      released[#released + 1] = session
    end
  end
end
local served = {}
if #released > 0 then served = serve(t) end
if #released == 0 then return {1, stray, {}, {}} end
return remember({1, stray, released, served})
