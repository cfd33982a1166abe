-- Renew the leases of the sessions a replica holds: KEYS are triples (record, subject's set,
-- address's set), ARGV[1] the lease (s), then a pair per triple: the session id and its record
-- as JSON. A record still stored keeps its value (a resume elsewhere may have bumped it) and gets
-- a new lease; a missing one (Redis restarted and lost it, or its lease lapsed while the replica
-- could not reach Redis) is stored again from the replica's copy, without the caps' checks: the
-- session runs already. Either way it counts again in its subject's and address's sets.
local lease = tonumber(ARGV[1])
local ttl = math.ceil(lease)
local t = redis.call('TIME')
local ends = tonumber(t[1]) + tonumber(t[2]) / 1000000 + lease
local restored = 0
for i = 1, #KEYS, 3 do
  local n = (i - 1) / 3
  local session = ARGV[2 + 2 * n]
  if redis.call('EXPIRE', KEYS[i], ttl) == 0 then
    redis.call('SET', KEYS[i], ARGV[3 + 2 * n], 'EX', ttl)
    restored = restored + 1
  end
  for j = i + 1, i + 2 do
    redis.call('ZADD', KEYS[j], ends, session)
    redis.call('EXPIRE', KEYS[j], ttl)
  end
end
return restored
