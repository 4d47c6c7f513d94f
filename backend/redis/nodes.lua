-- nodes.lua: register one sluice node, count the live ones, and decide
-- whether it may hold a standing share (docs/operations.md, "N: the node
-- registry"; docs/decisions/0021-share-admission.md).
--
-- KEYS[1]  the node set, a sorted set: member = node id, score = expiry (ms, Redis clock)
-- KEYS[2]  the share registry (same hash slot), a hash: field = one process
--          (id#incarnation), value = "expiry seq held digest", where held is a
--          lower bound of the n that process may size a share by (0: it holds
--          none) and digest the hex digest of its rules' shares;
--          field "settle" = Redis ms until which no process is admitted or grows
-- ARGV[1]  this node's id
-- ARGV[2]  time to live of a heartbeat, in ms
-- ARGV[3]  this process' field in KEYS[2]
-- ARGV[4]  this heartbeat's sequence number, increasing per process
-- ARGV[5]  ack: the n this process sizes its share by when it sent this
--          heartbeat, 0 when it held none
-- ARGV[6]  "1" when Redis lacked this script (a restart, failover or SCRIPT
--          FLUSH: the registry may be lost or older than what nodes saw)
-- ARGV[7]  the digest of the shares this process' rules hold (hex): while a
--          live process publishes another, nobody holds a share
--
-- Reply: {live nodes in KEYS[1], n, 1 if this process holds a share else 0,
-- 1 if a live process publishes another digest else 0};
-- an error for a heartbeat older than one already applied (it changes nothing).
--
-- Expired entries are removed on every call; both keys expire one TTL after
-- the last heartbeat of any node. Redis' clock is used, so node clocks may
-- disagree without miscounting. Every node must use the same TTL.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local me, seq, ack, digest = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[7]

if not string.match(digest, '^%x+$') then
  return redis.error_reply('DIGEST not hex: ' .. digest)
end

local settle, mine, live, differ = nil, nil, 1, 0
local held = {} -- the held bound of every other process that may hold a share
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  local f, v = raw[i], raw[i + 1]
  if f == 'settle' then
    settle = tonumber(v)
  else
    -- An entry without a digest (a build before digests) counts as live
    -- with another digest, so that it is neither dropped nor shared with.
    local exp, s, h, d = string.match(v, '^(%d+) (%d+) (%d+) ?(%x*)$')
    if not exp or tonumber(exp) <= now then
      redis.call('HDEL', KEYS[2], f)
    elseif f == me then
      mine = {seq = tonumber(s), held = tonumber(h)}
    else
      live = live + 1
      if d ~= digest then differ = 1 end
      if tonumber(h) > 0 then held[#held + 1] = tonumber(h) end
    end
  end
end
if mine and seq <= mine.seq then
  return redis.error_reply('STALE heartbeat ' .. seq .. ' after ' .. mine.seq)
end

-- Lost state (a new, flushed or expired registry, or a Redis without this
-- script: restarted, perhaps from an older snapshot): for one TTL nobody is
-- admitted and no holder grows, so every share sized before the loss is
-- registered again or ended by its node before the registry is relied on.
if not settle or ARGV[6] == '1' then
  settle = math.max(settle or 0, now + ttl)
end
local settling = now < settle

-- Rules that split a limit otherwise (a rollout): nobody holds a share,
-- every node sends its hits to Redis (docs/decisions/0021-standing-shares.md).
local agreed = differ == 0
local n, admitted, bound = live, 0, 0
if ack > 0 then
  -- A holder keeps its share (after a loss too: it is registered again)
  -- while the rules agree. Until its reply arrives it still uses ack,
  -- after it n, or none when it is told to stop: held is the smaller.
  if agreed then admitted = 1 end
  if settling then n = math.max(ack, live) end
  bound = math.min(ack, n)
elseif not settling and agreed then
  -- Admitted only when every holder already sizes by at least the holders
  -- it would make.
  admitted = 1
  for _, h in ipairs(held) do
    if h < #held + 1 then
      admitted = 0
      break
    end
  end
  if admitted == 1 then bound = n end
end
redis.call('HSET', KEYS[2], me, string.format('%d %d %d %s', now + ttl, seq, bound, digest),
  'settle', string.format('%d', settle))
redis.call('PEXPIRE', KEYS[2], ttl)

redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return {redis.call('ZCARD', KEYS[1]), n, admitted, differ}
