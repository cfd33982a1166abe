-- Every worker, in registration order: {id, info, last seen, load, {sessions}, draining (0/1)}.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', K_ORDER, 0, -1)) do
  out[#out + 1] = {
    id,
    redis.call('HGET', K_WORKERS, id),
    redis.call('ZSCORE', K_SEEN, id),
    redis.call('HGET', K_LOAD, id) or '{}',
    redis.call('ZRANGE', SESSIONS .. id, 0, -1),
    redis.call('SISMEMBER', K_DRAINING, id),
  }
end
return out
