"""The Lua scripts behind ``redis_index.py`` (which documents the key schema; nothing else imports this).

Conventions shared by every script:

* Block hashes travel as one blob of 8-byte big-endian values: thousands of separate arguments cost more to
  pack and parse than the lookups themselves. ``upto(j)`` splits the blob lazily into ``F[1..j]``.
* Hashes never become Lua numbers (doubles lose bits above 2**53): they stay 8-byte strings.
* Expiry uses the server's clock (``TIME``); ``live(v)`` says whether a field value (expires-at ms, "0" =
  never) is unexpired.
* Fencing (``lease.py``): STORE, REMOVE and CLEAR take the endpoint's lease HASH as their **last key** and a
  fencing token as their **last argument** (``''`` = unfenced). A fenced write whose token is not the lease's
  current one (a deposed owner's, or one whose lease expired) changes nothing and returns -1.
* A holder bitmap is a string, bit ``slot % 8`` of byte ``slot // 8 + 1`` for the endpoint in ``slot``, with
  trailing zero bytes stripped, so equal holder sets are equal (interned, pointer-compared) Lua strings.
"""

from __future__ import annotations

CHUNK = 1000  # arguments per multi-field command inside scripts (Lua's unpack() has a stack limit)
RECLAIM_PER_STORE = 256  # expired entries a store drops (soonest first) from the endpoint it writes
DRAIN_PER_MATCH = 256  # ... and a match from each endpoint it reads, before the walk

_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function live(v) return v and (v == '0' or tonumber(v) > now) end

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
    s = s .. string.rep('\\0', i - #s)
  end
  local b, m = string.byte(s, i), 2 ^ (slot % 8)
  if on then b = bit.bor(b, m) else b = bit.band(b, 255 - m) end
  s = string.sub(s, 1, i - 1) .. string.char(b) .. string.sub(s, i + 1)
  local e = #s
  while e > 0 and string.byte(s, e) == 0 do e = e - 1 end
  return string.sub(s, 1, e)
end

-- Set or clear ``slot`` in the holder bitmaps of ``list``'s members; empty bitmaps are deleted.
local function mark(M, list, slot, on)
  for i = 1, #list, CHUNK do
    local j = math.min(i + CHUNK - 1, #list)
    local vals = redis.call('HMGET', M, unpack(list, i, j))
    local sets, dels = {}, {}
    for k = i, j do
      local old = vals[k - i + 1] or ''
      local new = withbit(old, slot, on)
      if new == '' then
        if old ~= '' then dels[#dels + 1] = list[k] end
      elseif new ~= old then
        sets[#sets + 1] = list[k]; sets[#sets + 1] = new
      end
    end
    if #sets > 0 then redis.call('HSET', M, unpack(sets)) end
    if #dels > 0 then redis.call('HDEL', M, unpack(dels)) end
  end
end

-- An endpoint with no entries left gives its slot back (no bitmap has it set any more).
local function release(SLOTS, FREE, H, Z, X, ep, slot)
  if redis.call('HLEN', H) == 0 then
    redis.call('HDEL', SLOTS, ep)
    redis.call('ZADD', FREE, slot, slot)
    redis.call('DEL', Z, X)
  end
end

-- Forget ``list``'s members on one endpoint: its HASH, LRU and expiry sets, and its bit in their bitmaps.
local function forget(M, H, Z, X, list, slot)
  for i = 1, #list, CHUNK do
    local j = math.min(i + CHUNK - 1, #list)
    redis.call('HDEL', H, unpack(list, i, j))
    redis.call('ZREM', Z, unpack(list, i, j))
    redis.call('ZREM', X, unpack(list, i, j))
  end
  mark(M, list, slot, false)
end

-- Drop up to ``limit`` expired entries of one endpoint (found by expiry in X). True if none is left.
local function drain(M, H, Z, X, slot, limit)
  local expired = redis.call('ZRANGEBYSCORE', X, '-inf', now, 'LIMIT', 0, limit + 1)
  local done = #expired <= limit
  if not done then expired[#expired] = nil end
  if #expired > 0 then forget(M, H, Z, X, expired, slot) end
  return done
end
"""

# KEYS: M, SLOTS, FREE, then (H, Z, X) per endpoint. ARGV: the request's hashes (blob), then the endpoints.
# Returns one count per endpoint, as one space-separated string. Expired entries of the requested endpoints are
# dropped first (up to DRAIN each), so that the bitmaps are exact; only an endpoint with a larger backlog is
# verified per block.
MATCH = """
local M, SLOTS, FREE = KEYS[1], KEYS[2], KEYS[3]
local eps = {}
for i = 2, #ARGV do eps[#eps + 1] = ARGV[i] end
local slots = redis.call('HMGET', SLOTS, unpack(eps))
local alive, slot, depth, verify = {}, {}, {}, {}
for k = 1, #eps do
  depth[k] = 0
  if slots[k] then
    slot[k] = tonumber(slots[k])
    local H, Z, X = KEYS[3 * k + 1], KEYS[3 * k + 2], KEYS[3 * k + 3]
    verify[k] = not drain(M, H, Z, X, slot[k], DRAIN)
    if redis.call('EXISTS', H) == 1 then
      alive[#alive + 1] = k
    else
      release(SLOTS, FREE, H, Z, X, eps[k], slot[k])  -- everything it had expired
    end
  end
end
-- Walk the blocks in order. The live endpoints are grouped by the bitmap byte holding their bit; when a
-- block's bitmap differs from the last one, only the groups whose byte changed are checked (a live endpoint's
-- bit was set in the last bitmap, so an unchanged byte keeps it), so the cost is per changed byte, not per
-- endpoint and block.
local group, bytes, mask, left = {}, {}, {}, #alive
for _, k in ipairs(alive) do
  local i = math.floor(slot[k] / 8) + 1
  mask[k] = 2 ^ (slot[k] % 8)
  if not group[i] then group[i] = {}; bytes[#bytes + 1] = i end
  group[i][#group[i] + 1] = k
end
local d, prev, step = 0, nil, 16
while left > 0 and d < n do
  local hi = math.min(n, d + step)
  upto(hi)
  local vals = redis.call('HMGET', M, unpack(F, d + 1, hi))
  local stop = false
  for j = 1, #vals do
    local v = vals[j]
    if not v then stop = true; break end
    if v ~= prev then
      for _, i in ipairs(bytes) do
        local b = string.byte(v, i) or 0
        if not prev or b ~= (string.byte(prev, i) or 0) then
          local keep = {}
          for _, k in ipairs(group[i]) do
            if bit.band(b, mask[k]) ~= 0 then keep[#keep + 1] = k else depth[k] = d; left = left - 1 end
          end
          group[i] = keep
        end
      end
      prev = v
      if left == 0 then stop = true; break end
    end
    d = d + 1
  end
  if stop then break end
  step = math.min(step * 2, 2048)
end
for _, i in ipairs(bytes) do
  for _, k in ipairs(group[i]) do depth[k] = d end
end
-- An endpoint with more expired entries than one drain takes: check its run's expiries in its HASH.
for k = 1, #eps do
  if depth[k] > 0 and verify[k] then
    local H, held, s = KEYS[3 * k + 1], 0, 64
    while held < depth[k] do
      local hi = math.min(depth[k], held + s)
      local vals = redis.call('HMGET', H, unpack(F, held + 1, hi))
      local j, m = 1, #vals
      while j <= m and live(vals[j]) do j = j + 1 end
      held = held + j - 1
      if j <= m then break end
      s = math.min(s * 2, 2048)
    end
    depth[k] = held
  end
end
return table.concat(depth, " ")  -- one bulk reply: cheaper for the client to read than an array
"""

# KEYS: M, SLOTS, FREE, NEXT, H, Z, X, LEASE. ARGV: endpoint, ttl_ms (0 = none), capacity (-1 = none), blob, token.
STORE = """
local M, SLOTS, FREE, NEXT, H, Z, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local ep, ttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if fenced() then return -1 end
local slot = redis.call('HGET', SLOTS, ep)
if not slot then
  local free = redis.call('ZPOPMIN', FREE)
  if free[1] then slot = free[1] else slot = redis.call('INCR', NEXT) - 1 end
  redis.call('HSET', SLOTS, ep, slot)
end
slot = tonumber(slot)
upto(n)
local exp = '0'
if ttl > 0 then exp = string.format('%.0f', now + ttl) end
for i = 1, n, CHUNK do
  local j = math.min(i + CHUNK - 1, n)
  local args, xs = {}, {}
  for k = i, j do
    args[#args + 1] = F[k]; args[#args + 1] = exp
    xs[#xs + 1] = exp; xs[#xs + 1] = F[k]
  end
  redis.call('HSET', H, unpack(args))
  if ttl > 0 then
    redis.call('ZADD', X, unpack(xs))
  elseif redis.call('EXISTS', X) == 1 then
    redis.call('ZREM', X, unpack(F, i, j))  -- stored again without a ttl: never expires now
  end
end
mark(M, F, slot, true)
if cap >= 0 then
  local top = redis.call('ZRANGE', Z, -1, -1, 'WITHSCORES')
  local base = 0
  if top[2] then base = tonumber(top[2]) end
  for i = 1, n, CHUNK do
    local args = {}
    for k = i, math.min(i + CHUNK - 1, n) do
      args[#args + 1] = base + (n - k + 1)  -- head block highest: the tail is evicted first
      args[#args + 1] = F[k]
    end
    redis.call('ZADD', Z, unpack(args))
  end
  local over = redis.call('HLEN', H) - cap
  while over > 0 do
    local victims = redis.call('ZRANGE', Z, 0, math.min(over, CHUNK) - 1)
    if #victims == 0 then break end
    forget(M, H, Z, X, victims, slot)
    over = over - #victims
  end
end
drain(M, H, Z, X, slot, RECLAIM)
release(SLOTS, FREE, H, Z, X, ep, slot)
return n
"""

# KEYS: M, SLOTS, FREE, H, Z, X, LEASE. ARGV: endpoint, blob, token.
REMOVE = """
local M, SLOTS, FREE, H, Z, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local ep = ARGV[1]
if fenced() then return -1 end
local slot = redis.call('HGET', SLOTS, ep)
if not slot then return 0 end
slot = tonumber(slot)
upto(n)
local gone = {}
for i = 1, n, CHUNK do
  local j = math.min(i + CHUNK - 1, n)
  local vals = redis.call('HMGET', H, unpack(F, i, j))
  for k = i, j do if vals[k - i + 1] then gone[#gone + 1] = F[k] end end
end
forget(M, H, Z, X, gone, slot)
release(SLOTS, FREE, H, Z, X, ep, slot)
return #gone
"""

# KEYS: M, SLOTS, FREE, H, Z, X, LEASE. ARGV: endpoint, the slice size, an empty blob, token. Returns entries left.
CLEAR = """
local M, SLOTS, FREE, H, Z, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local ep, slice = ARGV[1], tonumber(ARGV[2])
if fenced() then return -1 end
local slot = redis.call('HGET', SLOTS, ep)
if not slot then redis.call('DEL', H, Z, X); return 0 end
slot = tonumber(slot)
forget(M, H, Z, X, redis.call('HRANDFIELD', H, slice), slot)
release(SLOTS, FREE, H, Z, X, ep, slot)
return redis.call('HLEN', H)
"""


def render(body: str, *, blob_arg: int) -> str:
    """A script with the common helpers, its blob argument index and the size constants filled in."""
    text = _COMMON.replace("ARGV[BLOB]", f"ARGV[{blob_arg}]") + body
    for name, value in (("CHUNK", CHUNK), ("RECLAIM", RECLAIM_PER_STORE), ("DRAIN", DRAIN_PER_MATCH)):
        text = text.replace(name, str(value))
    return text
