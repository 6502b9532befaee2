-- KEYS: load. ARGV: rate (tokens/s), add (tokens, may be 0), then the endpoints. With add > 0 there is exactly
-- one endpoint. Returns the drained queues (strings, for exact floats).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1]) / 1000.0
local add = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  local q = 0.0
  if v then
    local sep = string.find(v, ':', 1, true)
    local tokens = tonumber(string.sub(v, 1, sep - 1))
    local at = tonumber(string.sub(v, sep + 1))
    q = math.max(0.0, tokens - rate * math.max(0, now - at))
  end
  if add > 0 then
    q = q + add
    redis.call('HSET', KEYS[1], ARGV[i], string.format('%.1f', q) .. ':' .. now)
  end
  out[#out + 1] = string.format('%.1f', q)
end
return out
