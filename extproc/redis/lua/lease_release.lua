-- KEYS: lease. ARGV: token. Returns 1, or 0 when the lease is not (or no longer) ours.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
