-- A session record's share epoch + 1 (its owner stopped sharing: the links minted before open
-- nothing), keeping its expiry; nil if it is gone.
local text = redis.call('GET', KEYS[1])
if not text then return nil end
local doc = cjson.decode(text)
doc['share_epoch'] = (doc['share_epoch'] or 0) + 1
local out = cjson.encode(doc)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
return out
