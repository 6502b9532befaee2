-- KEYS: M, SLOTS, FREE, U, HOLEY, NEXT, H, Z, X, LEASE. ARGV: endpoint, ttl_ms (0 = none), capacity (-1 = none),
-- blob, chain, token. ``chain``: '' (no claim) or 13 bytes per segment: its first index (4 bytes, big-endian,
-- 0-based), 'r' (from a prompt's first block) or 'p', and the parent (8 bytes; zeros after 'r').
K.M, K.SLOTS, K.FREE, K.U, K.HOLEY = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
K.H, K.Z, K.X = KEYS[7], KEYS[8], KEYS[9]
local NEXT = KEYS[6]
local ep, ttl, cap, chain = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[5]
K.ep = ep
if fenced() then return -1 end
local slot = redis.call('HGET', K.SLOTS, ep)
if not slot then
  local free = redis.call('ZPOPMIN', K.FREE)
  if free[1] then slot = free[1] else slot = redis.call('INCR', NEXT) - 1 end
  redis.call('HSET', K.SLOTS, ep, slot)
end
slot = tonumber(slot)
K.slot = slot
upto(n)
local exp = '0'
if ttl > 0 then exp = string.format('%.0f', now + ttl) end
-- Where the claimed segments start (1-based) and what they follow ('' = a prompt's first block).
local starts = {}
for s = 1, #chain, 13 do
  local a, b, c, d = string.byte(chain, s, s + 3)
  local parent = ''
  if string.sub(chain, s + 4, s + 4) == 'p' then parent = string.sub(chain, s + 5, s + 12) end
  starts[((a * 256 + b) * 256 + c) * 256 + d + 1] = parent
end
local claimed = #chain > 0
-- New values, computed in order from the old ones (a hash stored twice in one call sees its first value).
local old = {}
for i = 1, n, CHUNK do
  local j = math.min(i + CHUNK - 1, n)
  local vals = redis.call('HMGET', K.H, unpack(F, i, j))
  for k = i, j do old[k] = vals[k - i + 1] end
end
local new, outside, unrooted, holey = {}, {}, 0, 0
local function adopt(parent)  -- a rooted child now names ``parent``
  if parent == '' then return end
  local v = new[parent]
  if v then
    local e, r, c, pp = parse(v)
    new[parent] = rooted(e, c + 1, pp)
  else
    outside[parent] = (outside[parent] or 0) + 1
  end
end
local parent, prev_rooted = nil, false
for k = 1, n do
  local h = F[k]
  if starts[k] ~= nil then
    parent = starts[k]
    if parent == '' then
      prev_rooted = true
    else
      local pv = new[parent] or redis.call('HGET', K.H, parent)
      prev_rooted = pv and select(2, parse(pv)) and live(pv) or false  -- (HGET's nil is false in Lua)
    end
  elseif claimed and k > 1 then
    parent = F[k - 1]
  end
  local was = new[h] or old[k]
  local v, r
  if was then
    local _, wr, c, wp = parse(was)
    if wr then
      v, r = rooted(exp, c, wp), true
      if parent ~= nil and wp ~= parent then holey = holey + 1 end  -- claims disagree: stop trusting it
    elseif parent ~= nil and prev_rooted then
      v, r = rooted(exp, 0, parent), true
      unrooted = unrooted - 1
      adopt(parent)
    else
      v, r = exp, false
    end
  elseif parent ~= nil and prev_rooted then
    v, r = rooted(exp, 0, parent), true
    adopt(parent)
  else
    v, r = exp, false
    unrooted = unrooted + 1
  end
  new[h] = v
  prev_rooted = r
end
for i = 1, n, CHUNK do
  local j = math.min(i + CHUNK - 1, n)
  local args, xs = {}, {}
  for k = i, j do
    args[#args + 1] = F[k]; args[#args + 1] = new[F[k]]
    xs[#xs + 1] = exp; xs[#xs + 1] = F[k]
  end
  redis.call('HSET', K.H, unpack(args))
  if ttl > 0 then
    redis.call('ZADD', K.X, unpack(xs))
  elseif redis.call('EXISTS', K.X) == 1 then
    redis.call('ZREM', K.X, unpack(F, i, j))  -- stored again without a ttl: never expires now
  end
end
for p, c in pairs(outside) do bump_kids(p, c) end
if unrooted ~= 0 then redis.call('HINCRBY', K.U, ep, unrooted) end
if holey > 0 then redis.call('HINCRBY', K.HOLEY, ep, holey) end
mark(F, true)
if cap >= 0 then
  local top = redis.call('ZRANGE', K.Z, -1, -1, 'WITHSCORES')
  local base = 0
  if top[2] then base = tonumber(top[2]) end
  for i = 1, n, CHUNK do
    local args = {}
    for k = i, math.min(i + CHUNK - 1, n) do
      args[#args + 1] = base + (n - k + 1)  -- head block highest: the tail is evicted first
      args[#args + 1] = F[k]
    end
    redis.call('ZADD', K.Z, unpack(args))
  end
  local over = redis.call('HLEN', K.H) - cap
  while over > 0 do
    local victims = redis.call('ZRANGE', K.Z, 0, math.min(over, CHUNK) - 1)
    if #victims == 0 then break end
    forget(victims)
    over = over - #victims
  end
end
drain(RECLAIM)
release()
return n
