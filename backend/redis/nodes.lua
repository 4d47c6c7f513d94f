-- nodes.lua: register one sluice node and count the live ones.
--
-- KEYS[1]  the node set, a sorted set: member = node id, score = expiry (ms, Redis clock)
-- ARGV[1]  this node's id
-- ARGV[2]  time to live of a heartbeat, in ms
--
-- Reply: the number of live nodes, this one included.
--
-- Expired members are removed on every call; the set itself expires one TTL
-- after the last heartbeat of any node. Redis' clock is used, so node clocks
-- may disagree without miscounting.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
