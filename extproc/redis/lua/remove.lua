-- KEYS: M, SLOTS, FREE, U, HOLEY, H, Z, X, LEASE. ARGV: endpoint, blob, token.
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
