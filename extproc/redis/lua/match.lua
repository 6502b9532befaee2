-- KEYS: M, SLOTS, FREE, U, HOLEY, then (H, Z, X) per endpoint. ARGV: the request's hashes (blob: a prompt's
-- blocks from its first), then the endpoints. Returns "b" (bisected) or "w" (walked), then one count per
-- endpoint, as one space-separated string. Expired entries of the requested endpoints are dropped first (up to
-- DRAIN each), so that the bitmaps are exact; an endpoint with a larger backlog is verified per block.
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
