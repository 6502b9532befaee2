-- KEYS: stream, the endpoint's entries HASH (the prefix index's h:<endpoint>). Returns {seq, digest, entries}:
-- the last batch a writer applied (nil, nil: none stored) and how many blocks the shared index holds for it.
local pos = redis.call('HMGET', KEYS[1], 'seq', 'digest')
return {pos[1], pos[2], redis.call('HLEN', KEYS[2])}
