-- Renew the leases of live sessions: KEYS are triples (record, subject's set, address's set),
-- ARGV[1] the lease (s), then the session ids, one per triple. A record already gone (ended,
-- expired) is not brought back.
local lease = tonumber(ARGV[1])
local ttl = math.ceil(lease)
local t = redis.call('TIME')
local ends = tonumber(t[1]) + tonumber(t[2]) / 1000000 + lease
for i = 1, #KEYS, 3 do
  if redis.call('EXPIRE', KEYS[i], ttl) == 1 then
    local session = ARGV[1 + (i + 2) / 3]
    for j = i + 1, i + 2 do
      redis.call('ZADD', KEYS[j], ends, session)
      redis.call('EXPIRE', KEYS[j], ttl)
    end
  end
end
return 0
