-- Add or replace worker ARGV[4] (its info as JSON ARGV[5], ARGV[6] slots, ARGV[7] "1" if it
-- says it drains, ARGV[8] its instance); it keeps draining if it was and its instance is the
-- same. The sessions it serves (ARGV[10..]): kept if in its set, stray if placed elsewhere,
-- else adopted while slots last (owner "", lease ARGV[9] µs). Then serve the queue.
-- {{session, worker, ...served}, {stray}, {adopted}}.
local done = replay() if done then return done end
local id, info, slots = ARGV[4], ARGV[5], tonumber(ARGV[6])
local seen = now()
local t = now_us()
local old = redis.call('HGET', K_WORKERS, id)
local draining = ARGV[7] == '1'
if not draining and old and redis.call('SISMEMBER', K_DRAINING, id) == 1 then
  draining = (cjson.decode(old).instance or '') == ARGV[8]
end
redis.call('HSET', K_WORKERS, id, info)
redis.call('HSET', K_SLOTS, id, slots)
if draining then
  redis.call('SADD', K_DRAINING, id)
else
  redis.call('SREM', K_DRAINING, id)
end
if not redis.call('ZSCORE', K_ORDER, id) then
  redis.call('ZADD', K_ORDER, redis.call('INCR', K_SEQ), id)
end
redis.call('ZADD', K_SEEN, seen, id)
local key = SESSIONS .. id
local w = {id = id, slots = slots, used = tonumber(redis.call('HGET', K_USED, id)) or 0}
local ends = t + tonumber(ARGV[9])
local stray, adopted = {}, {}
for i = 10, #ARGV do
  local session = ARGV[i]
  if not redis.call('ZSCORE', key, session) then
    if known(session) or w.used >= w.slots then
      stray[#stray + 1] = session
    else
      claim(session, w, t)
      redis.call('HSET', K_WANTS, session, '')
      set_lease(session, '', ends)
      adopted[#adopted + 1] = session
    end
  end
end
update_free(id)
local reply = {serve(t), stray, adopted}
if #reply[1] + #stray + #adopted == 0 then return reply end
return remember(reply)
