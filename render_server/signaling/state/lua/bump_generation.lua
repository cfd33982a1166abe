-- A session record's generation + 1 (a resume) and the role of the token that resumed it
-- (ARGV[1]; "" keeps the role), keeping its expiry; nil if it is gone.
local text = redis.call('GET', KEYS[1])
if not text then return nil end
local doc = cjson.decode(text)
doc['generation'] = doc['generation'] + 1
if ARGV[1] ~= '' then doc['role'] = ARGV[1] end
local out = cjson.encode(doc)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
return out
