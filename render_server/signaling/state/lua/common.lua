-- Shared by every registry script (after fits.lua). KEYS are the fixed keys, then the call's
-- reply key; ARGV[1] is the prefix of the per-worker keys ("{prefix}:"), ARGV[2] the call's id,
-- ARGV[3] how long a reply is kept; the operation's own arguments start at ARGV[4].
local K_WORKERS, K_SLOTS, K_USED, K_FREE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_ORDER, K_SEEN, K_LOAD, K_QUEUE = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_WANTS, K_HOLDER, K_SEQ, K_PARKED = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local K_OWNER, K_LEASE, K_MOVED, K_DRAINING = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local DONE = KEYS[17]
local SESSIONS, CLAIMED = ARGV[1] .. 'sessions:', ARGV[1] .. 'claimed:'

-- server time, as a decimal string (exact in a zset score) and as the same double
local function now()
  local t = redis.call('TIME')
  local text = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  return text, tonumber(text)
end

-- server time in whole µs (exact in a double until the year 2255)
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(n) return string.format('%.0f', n) end  -- a whole number as text, exactly

-- a retried call answers what it answered the first time
local function replay()
  local reply = redis.call('GET', DONE)
  if reply then return cjson.decode(reply) end
  return nil
end

-- keep a reply that a retry could not give again (what it freed or served is gone by then);
-- numbers in it are small (cjson keeps 14 digits): times travel as text
local function remember(reply)
  if #reply > 0 then redis.call('SET', DONE, cjson.encode(reply), 'EX', tonumber(ARGV[3])) end
  return reply
end

-- a request's requirements; nil for "" (no requirement: any worker)
local function requirements(text)
  if text == nil or text == false or text == '' then return nil end
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

-- the workers with a free slot that are not draining, {id, slots, used}, in id order: members
-- of one score in a zset are kept in byte order, which for UTF-8 is Python's str order (Lua's
-- `<` on strings would follow strcoll, which depends on the locale Redis runs in)
local function free_workers()
  local ids = redis.call('ZRANGE', K_FREE, 0, -1)
  if #ids == 0 then return ids end
  local slots, used = hmget(K_SLOTS, ids), hmget(K_USED, ids)
  local free = {}
  for i, id in ipairs(ids) do free[i] = {id = id, slots = slots[i], used = used[i]} end
  return free
end

-- a worker is in the free set when it has a free slot and is not draining
local function update_free(id)
  local slots = tonumber(redis.call('HGET', K_SLOTS, id))
  if slots and (tonumber(redis.call('HGET', K_USED, id)) or 0) < slots
      and redis.call('SISMEMBER', K_DRAINING, id) == 0 then
    redis.call('ZADD', K_FREE, 0, id)
  else
    redis.call('ZREM', K_FREE, id)
  end
end

local function info_of(w)  -- decoded once per script, and only when a requirement needs it
  if w.info == nil then w.info = cjson.decode(redis.call('HGET', K_WORKERS, w.id)) end
  return w.info
end

-- the best free worker for `req`, leaving out the workers in `exclude` (a set; nil: none)
local function best(free, req, exclude)
  local pick = nil
  for _, w in ipairs(free) do
    if w.used < w.slots and (pick == nil or better(w, pick))
        and not (exclude and exclude[w.id])
        and (req == nil or fits(req, info_of(w))) then
      pick = w
    end
  end
  return pick
end

-- the workers other than the holder whose sets still hold a session (it moves away from them)
local function moved_of(session)
  local text = redis.call('HGET', K_MOVED, session)
  if not text then return {} end
  return cjson.decode(text)
end

local function set_moved(session, workers)
  if #workers == 0 then
    redis.call('HDEL', K_MOVED, session)
  else
    redis.call('HSET', K_MOVED, session, cjson.encode(workers))
  end
end

-- every worker whose set holds the session: the holder first, then those it moves away from
local function holders_of(session)
  local out = {}
  local holder = redis.call('HGET', K_HOLDER, session)
  if holder then out[1] = holder end
  for _, w in ipairs(moved_of(session)) do out[#out + 1] = w end
  return out
end

local function as_set(list)
  local out = {}
  for _, v in ipairs(list) do out[v] = true end
  return out
end

-- whether the session holds a claim or a queue or park entry
local function known(session)
  return redis.call('HEXISTS', K_HOLDER, session) == 1
      or redis.call('HEXISTS', K_MOVED, session) == 1
      or redis.call('ZSCORE', K_QUEUE, session) ~= false
      or redis.call('ZSCORE', K_PARKED, session) ~= false
end

local function set_lease(session, owner, ends)
  redis.call('HSET', K_OWNER, session, owner)
  redis.call('ZADD', K_LEASE, int(ends), session)
end

-- what is kept of a session that holds nothing any more goes
local function forget_if_gone(session)
  if known(session) then return end
  redis.call('HDEL', K_WANTS, session)
  redis.call('HDEL', K_OWNER, session)
  redis.call('ZREM', K_LEASE, session)
end

-- out of the queue or the park: whether it was waiting
local function unqueue(session)
  local queued = redis.call('ZREM', K_QUEUE, session)
  return redis.call('ZREM', K_PARKED, session) + queued > 0
end

-- claim a slot of worker w ({id, slots, used}) at time t (µs); a session held elsewhere is
-- moving: that claim stays, and its worker is noted
local function claim(session, w, t)
  local holder = redis.call('HGET', K_HOLDER, session)
  if holder and holder ~= w.id then
    local moved = moved_of(session)
    moved[#moved + 1] = holder
    set_moved(session, moved)
  end
  redis.call('ZADD', SESSIONS .. w.id, redis.call('INCR', K_SEQ), session)
  redis.call('HSET', CLAIMED .. w.id, session, int(t))
  redis.call('HSET', K_HOLDER, session, w.id)
  w.used = redis.call('HINCRBY', K_USED, w.id, 1)
  if w.used >= w.slots then redis.call('ZREM', K_FREE, w.id) end
end

-- the session no longer in the set of worker id, which it was moving away from
local function leave(session, id)
  local kept = {}
  for _, w in ipairs(moved_of(session)) do
    if w ~= id then kept[#kept + 1] = w end
  end
  set_moved(session, kept)
end

-- the session out of one worker's set (out of the holder index only if it is the holder);
-- whether it was there
local function unclaim(session, id)
  if redis.call('ZREM', SESSIONS .. id, session) == 0 then return false end
  redis.call('HDEL', CLAIMED .. id, session)
  redis.call('HINCRBY', K_USED, id, -1)
  update_free(id)
  if redis.call('HGET', K_HOLDER, session) == id then
    redis.call('HDEL', K_HOLDER, session)
  else
    leave(session, id)
  end
  return true
end

-- serve the queue in score order at time t (µs); returns {session, worker, session, worker, ...}
local function serve(t)
  local served = {}
  local free = free_workers()
  if #free == 0 then return served end
  local slots_left = 0
  for _, w in ipairs(free) do slots_left = slots_left + w.slots - w.used end
  local start, page_size = 0, 8  -- by rank: only this script removes from the queue meanwhile
  while slots_left > 0 do
    local page = redis.call('ZRANGE', K_QUEUE, start, start + page_size - 1)
    if #page == 0 then break end
    local removed = 0
    for _, session in ipairs(page) do
      local req = requirements(redis.call('HGET', K_WANTS, session))
      local w = best(free, req, as_set(holders_of(session)))
      if w then
        redis.call('ZREM', K_QUEUE, session)
        claim(session, w, t)
        removed = removed + 1
        served[#served + 1] = session
        served[#served + 1] = w.id
        slots_left = slots_left - 1
        if slots_left == 0 then break end
      end
    end
    start = start + #page - removed
    page_size = math.min(page_size * 4, 512)
  end
  return served
end

-- forget a worker; returns the sessions it was the holder of
local function drop(id)
  for _, key in ipairs({K_WORKERS, K_SLOTS, K_USED, K_LOAD}) do redis.call('HDEL', key, id) end
  for _, key in ipairs({K_FREE, K_ORDER, K_SEEN}) do redis.call('ZREM', key, id) end
  redis.call('SREM', K_DRAINING, id)
  local key = SESSIONS .. id
  local sessions = redis.call('ZRANGE', key, 0, -1)
  redis.call('DEL', key, CLAIMED .. id)
  local held = {}
  for _, session in ipairs(sessions) do
    if redis.call('HGET', K_HOLDER, session) == id then
      redis.call('HDEL', K_HOLDER, session)
      held[#held + 1] = session
    else
      leave(session, id)
    end
    forget_if_gone(session)
  end
  return held
end
