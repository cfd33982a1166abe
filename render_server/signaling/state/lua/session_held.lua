-- How many sessions a count set (KEYS[1]) holds whose lease has not ended (Redis time).
local t = redis.call('TIME')
return redis.call('ZCOUNT', KEYS[1], '(' .. t[1] .. '.' .. string.format('%06d', tonumber(t[2])),
                  '+inf')
