-- KEYS: load. ARGV: rate (tokens/s), pick ('' = read only), tokens to reserve on the pick, the pick's version
-- the caller decided on (-1 = reserve whatever it is), the ms from now to the reserved request's predicted first
-- token (0 = not estimated), then the endpoints to read (the pick among them, if any).
-- A field "<endpoint>" is "<tokens>:<updated_ms>:<version>"; every reservation bumps its endpoint's version, so
-- a caller whose version is stale knows another replica reserved there since it read (draining never bumps it).
-- A field "<endpoint>#busy" is the latest predicted first token (server ms) of a reservation there: the engine
-- is busy prefilling until then whatever its queue drained (a field of its own, which a replica that predates it
-- never reads).
-- Reserves only when tokens > 0 and the version matches (or is -1). Returns "1" (reserved) or "0", then for
-- each endpoint its drained queue (a string, for exact floats), version and ms still busy, after the reservation.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1]) / 1000.0
local pick, add, expected, busy = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local reserved = '0'
local out = {reserved}
for i = 6, #ARGV do
  local fields = redis.call('HMGET', KEYS[1], ARGV[i], ARGV[i] .. '#busy')
  local v, until_ms = fields[1], tonumber(fields[2] or '0') or 0
  local q, version = 0.0, 0
  if v then
    local a = string.find(v, ':', 1, true)
    local b = string.find(v, ':', a + 1, true)
    local at = tonumber(string.sub(v, a + 1, (b or 0) - 1))
    q = math.max(0.0, tonumber(string.sub(v, 1, a - 1)) - rate * math.max(0, now - at))
    if b then version = tonumber(string.sub(v, b + 1)) end
  end
  if ARGV[i] == pick and add > 0 and (expected < 0 or expected == version) then
    q, version, reserved = q + add, version + 1, '1'
    redis.call('HSET', KEYS[1], pick, string.format('%.1f', q) .. ':' .. now .. ':' .. version)
    if busy > 0 and now + busy > until_ms then
      until_ms = now + busy
      redis.call('HSET', KEYS[1], pick .. '#busy', tostring(until_ms))
    end
  end
  out[#out + 1] = string.format('%.1f', q)
  out[#out + 1] = tostring(version)
  out[#out + 1] = tostring(math.max(0, until_ms - now))
end
out[1] = reserved
return out
