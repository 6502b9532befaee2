-- KEYS: lease, stream. ARGV: token, seq, digest. Stores the last applied batch; 0 when the lease is not ours.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'seq', ARGV[2], 'digest', ARGV[3])
return 1
