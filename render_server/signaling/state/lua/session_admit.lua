-- Store a new session's record (KEYS[1]) unless its subject (KEYS[2]) or its address (KEYS[3])
-- holds as many sessions as its cap already: counted and stored in one step, so that two
-- replicas never both take the last place.
-- The count sets map session id -> when its lease ends (Redis time); entries past it are dropped
-- before counting: a record nobody renewed stops counting when it expires.
-- ARGV: the record as JSON, the session id, the lease (s), the subject's and the address's caps
-- (0: none). Returns {} once stored, else {cap, held, limit}.
local record, session, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sets = {{KEYS[2], tonumber(ARGV[4]), 'subject'}, {KEYS[3], tonumber(ARGV[5]), 'address'}}
for _, set in ipairs(sets) do
  redis.call('ZREMRANGEBYSCORE', set[1], '-inf', now)
  if set[2] > 0 then
    local held = redis.call('ZCARD', set[1])
    if held >= set[2] then return {set[3], held, set[2]} end
  end
end
local ttl = math.ceil(lease)
for _, set in ipairs(sets) do
  redis.call('ZADD', set[1], now + lease, session)
  redis.call('EXPIRE', set[1], ttl)  -- no set outlives the last lease in it
end
redis.call('SET', KEYS[1], record, 'EX', ttl)
return {}
