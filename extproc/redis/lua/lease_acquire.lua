-- KEYS: lease, stream. ARGV: owner, ttl_ms. Returns the token now held by ``owner``, or 0 (someone else's).
local held = redis.call('HMGET', KEYS[1], 'owner', 'token')
if held[1] then
  if held[1] ~= ARGV[1] then return 0 end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(held[2])
end
if redis.call('HEXISTS', KEYS[2], 'fence') == 0 then  -- first use, or Redis lost its data: start above any
  local t = redis.call('TIME')                        -- token handed out before (one per ms at most)
  redis.call('HSET', KEYS[2], 'fence', string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(t[2] / 1000)))
end
local token = redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', string.format('%.0f', token))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
