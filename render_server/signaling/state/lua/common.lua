-- Shared by every registry script (after fits.lua). KEYS are the fixed keys, then the call's
-- reply key; ARGV[1] is the prefix of the per-worker session sets, ARGV[2] the call's id,
-- ARGV[3] how long a reply is kept; the operation's own arguments start at ARGV[4].
local K_WORKERS, K_SLOTS, K_USED, K_FREE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_ORDER, K_SEEN, K_LOAD, K_QUEUE = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_WANTS, K_HOLDER, K_SEQ, DONE = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local SESSIONS = ARGV[1]
-- server time, as a decimal string (exact in a zset score) and as the same double
local function now()
  local t = redis.call('TIME')
  local text = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  return text, tonumber(text)
end

-- a retried call answers what it answered the first time
local function replay()
  local reply = redis.call('GET', DONE)
  if reply then return cjson.decode(reply) end
  return nil
end

-- keep a reply that a retry could not give again (what it freed or served is gone by then)
local function remember(reply)
  if #reply > 0 then redis.call('SET', DONE, cjson.encode(reply), 'EX', tonumber(ARGV[3])) end
  return reply
end

-- a request's requirements; nil for "" (no requirement: any worker)
local function requirements(text)
  if text == '' then return nil end
  return cjson.decode(text)
end

-- the least-loaded choice: lowest used/slots, then most free slots; ties go to the worker met
-- first, and workers are met in id order (see free_workers)
local function better(a, b)
  local ra, rb = a.used / a.slots, b.used / b.slots
  if ra ~= rb then return ra < rb end
  return a.slots - a.used > b.slots - b.used
end

local function hmget(key, ids)  -- unpack() takes a limited number of arguments: in parts
  local out = {}
  for first = 1, #ids, 1000 do
    local part = redis.call('HMGET', key, unpack(ids, first, math.min(first + 999, #ids)))
    for j = 1, #part do out[first + j - 1] = tonumber(part[j]) or 0 end
  end
  return out
end

-- the workers with a free slot, {id, slots, used}, in id order: members of one score in a zset
-- are kept in byte order, which for UTF-8 is Python's str order (Lua's `<` on strings would
-- follow strcoll, which depends on the locale Redis runs in)
local function free_workers()
  local ids = redis.call('ZRANGE', K_FREE, 0, -1)
  if #ids == 0 then return ids end
  local slots, used = hmget(K_SLOTS, ids), hmget(K_USED, ids)
  local free = {}
  for i, id in ipairs(ids) do free[i] = {id = id, slots = slots[i], used = used[i]} end
  return free
end

local function info_of(w)  -- decoded once per script, and only when a requirement needs it
  if w.info == nil then w.info = cjson.decode(redis.call('HGET', K_WORKERS, w.id)) end
  return w.info
end

local function best(free, req)
  local pick = nil
  for _, w in ipairs(free) do
    if w.used < w.slots and (pick == nil or better(w, pick))
        and (req == nil or fits(req, info_of(w))) then
      pick = w
    end
  end
  return pick
end

local function claim(session, w)
  redis.call('ZADD', SESSIONS .. w.id, redis.call('INCR', K_SEQ), session)
  redis.call('HSET', K_HOLDER, session, w.id)
  w.used = redis.call('HINCRBY', K_USED, w.id, 1)
  if w.used >= w.slots then redis.call('ZREM', K_FREE, w.id) end
end

-- serve the queue in arrival order; returns {session, worker, session, worker, ...}
local function serve()
  local served = {}
  local free = free_workers()
  if #free == 0 then return served end
  local slots_left = 0
  for _, w in ipairs(free) do slots_left = slots_left + w.slots - w.used end
  local after, page_size = '-inf', 8
  while slots_left > 0 do
    local page = redis.call('ZRANGEBYSCORE', K_QUEUE, after, '+inf', 'WITHSCORES',
                            'LIMIT', 0, page_size)
    if #page == 0 then break end
    for i = 1, #page, 2 do
      local session = page[i]
      local w = best(free, requirements(redis.call('HGET', K_WANTS, session)))
      if w then
        claim(session, w)
        redis.call('ZREM', K_QUEUE, session)
        redis.call('HDEL', K_WANTS, session)
        served[#served + 1] = session
        served[#served + 1] = w.id
        slots_left = slots_left - 1
        if slots_left == 0 then break end
      end
    end
    after = '(' .. page[#page]
    page_size = math.min(page_size * 4, 512)
  end
  return served
end

-- forget a worker; returns the sessions it held
local function drop(id)
  for _, key in ipairs({K_WORKERS, K_SLOTS, K_USED, K_LOAD}) do redis.call('HDEL', key, id) end
  for _, key in ipairs({K_FREE, K_ORDER, K_SEEN}) do redis.call('ZREM', key, id) end
  local key = SESSIONS .. id
  local sessions = redis.call('ZRANGE', key, 0, -1)
  for _, session in ipairs(sessions) do redis.call('HDEL', K_HOLDER, session) end
  redis.call('DEL', key)
  return sessions
end
