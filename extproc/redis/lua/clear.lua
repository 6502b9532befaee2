-- KEYS: M, SLOTS, FREE, U, HOLEY, H, Z, X, LEASE. ARGV: endpoint, the slice size, an empty blob, token.
-- Returns entries left.
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
