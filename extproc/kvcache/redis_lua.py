"""The Lua scripts behind ``redis_index.py`` (which documents the key schema; nothing else imports this).

Conventions shared by every script:

* Block hashes travel as one blob of 8-byte big-endian values: thousands of separate arguments cost more to
  pack and parse than the lookups themselves. ``upto(j)`` splits the blob lazily into ``F[1..j]``.
* Hashes never become Lua numbers (doubles lose bits above 2**53): they stay 8-byte strings.
* Expiry uses the server's clock (``TIME``); ``live(v)`` says whether a field value is unexpired.
* An entry's value (in ``h:<endpoint>``) is ``<expires-at ms>`` ("0" = never), or, for a **rooted** entry,
  ``<expires-at>|<rooted children>|<parent>``: stored as part of a claimed chain (``Chain``) whose parent was
  itself rooted (or none: a prompt's first block), so every ancestor was held when it was stored; ``parent``
  is 8 raw bytes ('' for a first block), the children count how many rooted entries name it as parent.
  ``u`` counts each endpoint's entries that are not rooted; ``holey`` counts its rooted entries whose parent
  it lost (orphans: +children left behind when a rooted entry goes, -1 when an orphan goes). An endpoint with
  neither is **clean**: each of its entries comes with all its ancestors, so along a prompt's chain what it
  holds is a prefix, and MATCH may bisect. (A parent stored again does not adopt its orphans: they stay
  counted until they go, which only costs bisection, never exactness.)
* The scripts keep their keys in ``K`` (filled from KEYS first), so the shared helpers need no key arguments.
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
    s = s .. string.rep('\\0', i - #s)
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
"""

# KEYS: M, SLOTS, FREE, U, HOLEY, then (H, Z, X) per endpoint. ARGV: the request's hashes (blob: a prompt's
# blocks from its first), then the endpoints. Returns "b" (bisected) or "w" (walked), then one count per
# endpoint, as one space-separated string.
# Expired entries of the requested endpoints are dropped first (up to DRAIN each), so that the bitmaps are exact;
# an endpoint with a larger backlog is verified per block.
MATCH = """
K.M, K.SLOTS, K.FREE, K.U, K.HOLEY = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local M = K.M
local eps = {}
for i = 2, #ARGV do eps[#eps + 1] = ARGV[i] end
local slots = redis.call('HMGET', K.SLOTS, unpack(eps))
local alive, slot, depth, verify = {}, {}, {}, {}
for k = 1, #eps do
  depth[k] = 0
  if slots[k] then
    slot[k] = tonumber(slots[k])
    K.H, K.Z, K.X, K.ep, K.slot = KEYS[3 * k + 3], KEYS[3 * k + 4], KEYS[3 * k + 5], eps[k], slot[k]
    verify[k] = not drain(DRAIN)
    if redis.call('EXISTS', K.H) == 1 then
      alive[#alive + 1] = k
    else
      release()  -- everything it had expired
    end
  end
end
-- The live endpoints, grouped by the bitmap byte holding their bit.
local group, bytes, mask, left = {}, {}, {}, #alive
for _, k in ipairs(alive) do
  local i = math.floor(slot[k] / 8) + 1
  mask[k] = 2 ^ (slot[k] % 8)
  if not group[i] then group[i] = {}; bytes[#bytes + 1] = i end
  group[i][#group[i] + 1] = k
end
-- Bitmap ``v`` follows ``before`` (nil: the first one): drop the live endpoints whose bit is off in ``v``,
-- giving them ``d`` blocks. Only the bytes that changed are looked at (a live endpoint's bit was set in
-- ``before``), so the cost is per changed byte, not per endpoint.
local function narrow(v, before, d)
  for _, i in ipairs(bytes) do
    local b = string.byte(v, i) or 0
    if not before or b ~= (string.byte(before, i) or 0) then
      local keep = {}
      for _, k in ipairs(group[i]) do
        if bit.band(b, mask[k]) ~= 0 then keep[#keep + 1] = k else depth[k] = d; left = left - 1 end
      end
      group[i] = keep
    end
  end
end
-- Bisect when every live endpoint is clean: then each one's bit, along the request (a chain), is set on a
-- prefix of the blocks, and only the places where some bit turns off need finding.
if left == 0 then return 'b ' .. table.concat(depth, " ") end  -- nobody holds anything: nothing to walk
local bisect = true
local live_eps = {}
for x, k in ipairs(alive) do live_eps[x] = eps[k] end
local us = redis.call('HMGET', K.U, unpack(live_eps))
local hs = redis.call('HMGET', K.HOLEY, unpack(live_eps))
for x, k in ipairs(alive) do
  if verify[k] or (hs[x] and tonumber(hs[x]) ~= 0) or (us[x] and tonumber(us[x]) ~= 0) then
    bisect = false
    break
  end
end
if bisect then
  local B = {}  -- 0-based block position -> its bitmap ('' when nobody holds it)
  local function probe(positions)
    local fs = {}
    for x, p in ipairs(positions) do fs[x] = string.sub(blob, p * 8 + 1, p * 8 + 8) end
    for c = 1, #fs, CHUNK do
      local e = math.min(#fs, c + CHUNK - 1)
      local vals = redis.call('HMGET', M, unpack(fs, c, e))
      for x = c, e do B[positions[x]] = vals[x - c + 1] or '' end
    end
  end
  -- Split the intervals whose end bitmaps differ until they are adjacent blocks (``edges``: p where block
  -- p + 1's bitmap differs from block p's). Equal bitmaps are equal interned strings. Bits of endpoints not
  -- asked about may add edges, never lose one; past ``budget`` probes walking is cheaper, so walk instead.
  probe(n > 1 and {0, n - 1} or {0})
  local lo, hi, edges, budget = {}, {}, {}, math.floor(n / 3)
  if n > 1 and B[0] ~= B[n - 1] then lo[1], hi[1] = 0, n - 1 end
  while #lo > 0 and budget >= 0 do
    local mids = {}
    for x = 1, #lo do
      if hi[x] - lo[x] == 1 then edges[#edges + 1] = lo[x] else mids[#mids + 1] = math.floor((lo[x] + hi[x]) / 2) end
    end
    budget = budget - #mids
    if #mids > 0 then probe(mids) end
    local nlo, nhi, m = {}, {}, 0
    for x = 1, #lo do
      if hi[x] - lo[x] > 1 then
        m = m + 1
        local mid = mids[m]
        if B[lo[x]] ~= B[mid] then nlo[#nlo + 1] = lo[x]; nhi[#nhi + 1] = mid end
        if B[mid] ~= B[hi[x]] then nlo[#nlo + 1] = mid; nhi[#nhi + 1] = hi[x] end
      end
    end
    lo, hi = nlo, nhi
  end
  if #lo == 0 then
    -- Each live endpoint holds the blocks up to where its bit turns off: off in block 0 -> 0; off after
    -- edge p -> p + 1; never -> n.
    table.sort(edges)
    narrow(B[0], nil, 0)
    for _, p in ipairs(edges) do narrow(B[p + 1], B[p], p + 1) end
    for _, i in ipairs(bytes) do
      for _, k in ipairs(group[i]) do depth[k] = n end
    end
    return 'b ' .. table.concat(depth, " ")
  end
end
-- Otherwise walk the blocks in order, narrowing the live endpoints whenever a block's bitmap differs from
-- the last one.
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
      narrow(v, prev, d)
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
    local H, held, s = KEYS[3 * k + 3], 0, 64
    upto(depth[k])
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
return 'w ' .. table.concat(depth, " ")  -- one bulk reply: cheaper for the client to read than an array
"""

# KEYS: M, SLOTS, FREE, U, HOLEY, NEXT, H, Z, X, LEASE. ARGV: endpoint, ttl_ms (0 = none), capacity (-1 = none),
# blob, chain, token. ``chain``: '' (no claim) or 13 bytes per segment: its first index (4 bytes, big-endian,
# 0-based), 'r' (from a prompt's first block) or 'p', and the parent (8 bytes; zeros after 'r').
STORE = """
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
"""

# KEYS: M, SLOTS, FREE, U, HOLEY, H, Z, X, LEASE. ARGV: endpoint, blob, token.
REMOVE = """
K.M, K.SLOTS, K.FREE, K.U, K.HOLEY = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
K.H, K.Z, K.X, K.ep = KEYS[6], KEYS[7], KEYS[8], ARGV[1]
if fenced() then return -1 end
local slot = redis.call('HGET', K.SLOTS, K.ep)
if not slot then return 0 end
K.slot = tonumber(slot)
upto(n)
local gone = {}
for i = 1, n, CHUNK do
  local j = math.min(i + CHUNK - 1, n)
  local vals = redis.call('HMGET', K.H, unpack(F, i, j))
  for k = i, j do if vals[k - i + 1] then gone[#gone + 1] = F[k] end end
end
forget(gone)
release()
return #gone
"""

# KEYS: M, SLOTS, FREE, U, HOLEY, H, Z, X, LEASE. ARGV: endpoint, the slice size, an empty blob, token. Returns
# entries left.
CLEAR = """
K.M, K.SLOTS, K.FREE, K.U, K.HOLEY = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
K.H, K.Z, K.X, K.ep = KEYS[6], KEYS[7], KEYS[8], ARGV[1]
local slice = tonumber(ARGV[2])
if fenced() then return -1 end
local slot = redis.call('HGET', K.SLOTS, K.ep)
if not slot then
  redis.call('DEL', K.H, K.Z, K.X)
  redis.call('HDEL', K.U, K.ep)
  redis.call('HDEL', K.HOLEY, K.ep)
  return 0
end
K.slot = tonumber(slot)
forget(redis.call('HRANDFIELD', K.H, slice))
release()
return redis.call('HLEN', K.H)
"""


def render(body: str, *, blob_arg: int) -> str:
    """A script with the common helpers, its blob argument index and the size constants filled in."""
    text = _COMMON.replace("ARGV[BLOB]", f"ARGV[{blob_arg}]") + body
    for name, value in (("CHUNK", CHUNK), ("RECLAIM", RECLAIM_PER_STORE), ("DRAIN", DRAIN_PER_MATCH)):
        text = text.replace(name, str(value))
    return text
