-- Shared by match/store/remove/clear (prepended by scripts.index_script). Conventions: scripts.py's docstring.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local K = {}

-- An entry's value: expires-at, rooted?, rooted children, parent ('' for a first block).
local function parse(v)
  local p1 = string.find(v, '|', 1, true)
  if not p1 then return v, false, 0, '' end
  local p2 = string.find(v, '|', p1 + 1, true)
  return string.sub(v, 1, p1 - 1), true, tonumber(string.sub(v, p1 + 1, p2 - 1)), string.sub(v, p2 + 1)
end
local function rooted(exp, kids, parent) return exp .. '|' .. kids .. '|' .. parent end
local function live(v)
  if not v then return false end
  local exp = parse(v)
  return exp == '0' or tonumber(exp) > now
end

local blob = ARGV[BLOB]
local n = #blob / 8
local F, split = {}, 0
local function upto(j)
  for i = split + 1, j do F[i] = string.sub(blob, i * 8 - 7, i * 8) end
  if j > split then split = j end
end

local function fenced()
  local tok = ARGV[#ARGV]
  return tok ~= '' and redis.call('HGET', KEYS[#KEYS], 'token') ~= tok
end

local function withbit(s, slot, on)
  local i = math.floor(slot / 8) + 1
  if #s < i then
    if not on then return s end
    s = s .. string.rep('\0', i - #s)
  end
  local b, m = string.byte(s, i), 2 ^ (slot % 8)
  if on then b = bit.bor(b, m) else b = bit.band(b, 255 - m) end
  s = string.sub(s, 1, i - 1) .. string.char(b) .. string.sub(s, i + 1)
  local e = #s
  while e > 0 and string.byte(s, e) == 0 do e = e - 1 end
  return string.sub(s, 1, e)
end

-- Set or clear K.slot in the holder bitmaps of ``list``'s members; empty bitmaps are deleted.
local function mark(list, on)
  for i = 1, #list, CHUNK do
    local j = math.min(i + CHUNK - 1, #list)
    local vals = redis.call('HMGET', K.M, unpack(list, i, j))
    local sets, dels = {}, {}
    for k = i, j do
      local old = vals[k - i + 1] or ''
      local new = withbit(old, K.slot, on)
      if new == '' then
        if old ~= '' then dels[#dels + 1] = list[k] end
      elseif new ~= old then
        sets[#sets + 1] = list[k]; sets[#sets + 1] = new
      end
    end
    if #sets > 0 then redis.call('HSET', K.M, unpack(sets)) end
    if #dels > 0 then redis.call('HDEL', K.M, unpack(dels)) end
  end
end

-- Add ``delta`` to the rooted-children count of ``h`` on the endpoint in K. False if it does not hold ``h``.
local function bump_kids(h, delta)
  local v = redis.call('HGET', K.H, h)
  if not v then return false end
  local exp, r, c, parent = parse(v)
  if r then redis.call('HSET', K.H, h, rooted(exp, math.max(0, c + delta), parent)) end
  return true
end

-- An endpoint with no entries left gives its slot back (no bitmap has it set any more) and is clean again.
local function release()
  if redis.call('HLEN', K.H) == 0 then
    redis.call('HDEL', K.SLOTS, K.ep)
    redis.call('ZADD', K.FREE, K.slot, K.slot)
    redis.call('DEL', K.Z, K.X)
    redis.call('HDEL', K.U, K.ep)
    redis.call('HDEL', K.HOLEY, K.ep)
  end
end

-- Forget ``list``'s members on the endpoint in K: its HASH, LRU and expiry sets, its bit in their bitmaps,
-- and their part in ``u``, ``holey`` (orphans) and their parents' children counts.
local function forget(list)
  local seen, uniq = {}, {}
  for _, h in ipairs(list) do
    if not seen[h] then seen[h] = true; uniq[#uniq + 1] = h end
  end
  list = uniq
  local kids, dec, unrooted = {}, {}, 0
  for i = 1, #list, CHUNK do
    local j = math.min(i + CHUNK - 1, #list)
    local vals = redis.call('HMGET', K.H, unpack(list, i, j))
    for k = i, j do
      local v = vals[k - i + 1]
      if v then
        local _, r, c, parent = parse(v)
        if r then
          kids[list[k]] = c
          if parent ~= '' then dec[parent] = (dec[parent] or 0) + 1 end
        else
          unrooted = unrooted + 1
        end
      end
    end
  end
  local orphans = 0
  for h, c in pairs(kids) do
    if c > (dec[h] or 0) then orphans = orphans + c - (dec[h] or 0) end  -- rooted children left behind
  end
  for i = 1, #list, CHUNK do
    local j = math.min(i + CHUNK - 1, #list)
    redis.call('HDEL', K.H, unpack(list, i, j))
    redis.call('ZREM', K.Z, unpack(list, i, j))
    redis.call('ZREM', K.X, unpack(list, i, j))
  end
  mark(list, false)
  for parent, d in pairs(dec) do
    if kids[parent] == nil and not bump_kids(parent, -d) then
      orphans = orphans - d  -- their parent was gone: these were orphans already
    end
  end
  if unrooted > 0 then redis.call('HINCRBY', K.U, K.ep, -unrooted) end
  if orphans ~= 0 then redis.call('HINCRBY', K.HOLEY, K.ep, orphans) end
end

-- Drop up to ``limit`` expired entries of the endpoint in K (found by expiry in X). True if none is left.
local function drain(limit)
  local expired = redis.call('ZRANGEBYSCORE', K.X, '-inf', now, 'LIMIT', 0, limit + 1)
  local done = #expired <= limit
  if not done then expired[#expired] = nil end
  if #expired > 0 then forget(expired) end
  return done
end
