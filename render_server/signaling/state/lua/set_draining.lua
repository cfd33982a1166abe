-- Worker ARGV[4] drains (ARGV[5] = "1": no new claim) or stops draining (and the queue is
-- served). {known (0/1), {session, worker, ...served}}.
local done = replay() if done then return done end
local id = ARGV[4]
if redis.call('HEXISTS', K_WORKERS, id) == 0 then return {0, {}} end
if ARGV[5] == '1' then
  redis.call('SADD', K_DRAINING, id)
  update_free(id)
  return {1, {}}
end
redis.call('SREM', K_DRAINING, id)
update_free(id)
local served = serve(now_us())
if #served == 0 then return {1, {}} end
return remember({1, served})
