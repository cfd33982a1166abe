-- A session record's generation + 1 (a resume), keeping its expiry; nil if it is gone.
local text = redis.call('GET', KEYS[1])
if not text then return nil end
local doc = cjson.decode(text)
doc['generation'] = doc['generation'] + 1
local out = cjson.encode(doc)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
return out
