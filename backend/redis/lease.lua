-- lease.lua: take, lease and give back tokens of sluice's leased global
-- buckets (package backend/lease) in one call.
--
-- Representation (GCRA), as token_bucket.lua's but in keys of their own
-- ("<prefix>:lease:{<hash>}"): a bucket is one string value, its
-- "theoretical arrival time" TAT in microseconds of Redis' clock (TIME), as
-- one little-endian IEEE 754 double (struct.pack '<d', 8 bytes); any other
-- value, or none, is a full bucket. With interval = period / requests and
-- tau = burst * interval, a bucket at time now holds
-- burst - max(TAT - now, 0) / interval tokens. Taking c tokens moves TAT to
-- max(TAT, now) + c * interval; giving c back moves it to
-- max(TAT - c * interval, now), so a bucket is never above its burst.
--
-- KEYS[i]   bucket key i (i = 1..n); in Redis Cluster all in one slot.
-- ARGV[1]   64 bytes per key: eight little-endian doubles. For key i, at
--           byte 64(i-1) + 1:
--   decision  decision number; the keys of one decision are contiguous and
--             neighbouring decisions have different numbers
--   period    in microseconds (> 0)
--   requests  tokens added per period (0 = never allowed)
--   burst     capacity in tokens
--   need      tokens that must exist for the key to be allowed (1 for a
--             check, 0 for a prefetch, which is always allowed)
--   take      tokens taken when the decision is allowed (<= need)
--   extra     at most this many more whole tokens are leased once the
--             decision is allowed: floor(tokens left / share), capped here
--   share     > 0: the divisor of the lease (2 x live nodes)
--   flags     0 = take (all-or-nothing within the decision), 1 = give back
--             take tokens (never refused), 2 = independent take (decided
--             alone)
-- (nine values: the decision number, then eight; 72 bytes per key)
--
-- Reply: one string, 40 bytes per key, five little-endian doubles, each an
-- integer in [0, 2^53):
--   allowed   1 or 0
--   leased    whole tokens leased to the caller beyond take
--   remaining whole tokens left in Redis after the key
--   retry     for a refused key, microseconds until need tokens exist
--             (until the bucket is full when need > burst), rounded up
--   reset     microseconds until Redis' bucket is full, rounded up
--
-- Semantics per decision: first its takes, all-or-nothing on a scratch
-- copy; leases only for an allowed decision; then gives and independent
-- takes one by one. Requests 0: takes refused (retry and reset one period),
-- gives do nothing. A written key expires when its bucket is full again,
-- plus the time to refill or a second, whichever is less.

if redis.replicate_commands then
  redis.replicate_commands()
end

local EPS = 1
local SLACK = 1000
local MAXINT = 9007199254740991
local floor, ceil = math.floor, math.ceil
local pack, unpack = struct.pack, struct.unpack
local A = ARGV[1] or ''
local W = 72

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local n = #KEYS
if #A ~= W * n then
  return redis.error_reply('lease.lua: ARGV[1] has ' .. #A .. ' bytes, want 72 per key')
end

local tats, dirty, out = {}, {}, {}

local function committed(key)
  local v = tats[key]
  if v == nil then
    local s = redis.call('GET', key)
    if s and #s == 8 then v = unpack('<d', s) else v = 0 end
    tats[key] = v
  end
  return v
end

local function clamp(x)
  if not (x >= 0) then return 0 end
  if x > MAXINT then return MAXINT end
  return x
end

-- tokens returns the whole tokens a bucket at tat holds, and its debt.
local function tokens(tat, interval, tau, burst)
  local debt = tat - now
  if debt < 0 then debt = 0 end
  local r = floor((tau - debt + EPS) / interval)
  if r > burst then r = burst end
  return clamp(r), debt
end

local function args(k)
  return unpack('<dddddddd', A, W * (k - 1) + 9)
end

-- decide applies key k to tat (not the leases) and returns allowed, the
-- new TAT and the reply fields but leased.
local function decide(k, tat, give)
  local period, requests, burst, need, take = args(k)
  if requests <= 0 then
    if give then return true, tat, 0, 0, 0 end
    return false, tat, 0, period, period
  end
  local interval = period / requests
  local tau = burst * interval
  local base = tat
  if base < now then base = now end
  if give then
    local new = base - take * interval
    if new < now then new = now end
    if tat <= now then new = tat end
    return true, new, 0, 0, 0
  end
  if need > burst then
    return false, tat, 0, base - now, base - now
  end
  local wait = base + need * interval - tau - now
  if wait > EPS then
    return false, tat, 0, wait, base - now
  end
  if take > 0 then return true, base + take * interval, 0, 0, 0 end
  return true, tat, 0, 0, 0
end

-- lease takes key k's lease from tat and returns the new TAT and leased.
local function lease(k, tat)
  local period, requests, burst, _, _, extra, share = args(k)
  if requests <= 0 or extra <= 0 then return tat, 0 end
  local interval = period / requests
  local r = tokens(tat, interval, burst * interval, burst)
  local l = floor(r / share)
  if l > extra then l = extra end
  if l <= 0 then return tat, 0 end
  local base = tat
  if base < now then base = now end
  return base + l * interval, l
end

local function report(k, allowed, leased, retry, tat)
  local period, requests, burst = args(k)
  local remaining, reset = 0, period
  if requests > 0 then
    local interval = period / requests
    remaining, reset = tokens(tat, interval, burst * interval, burst)
  end
  out[k] = pack('<ddddd', allowed and 1 or 0, leased, remaining, clamp(ceil(retry)), clamp(ceil(reset)))
end

local i = 1
while i <= n do
  local d = unpack('<d', A, W * (i - 1) + 1)
  local j = i
  while j < n and unpack('<d', A, W * j + 1) == d do j = j + 1 end
  local flags = {}
  for k = i, j do flags[k] = unpack('<d', A, W * k - 7) end

  -- Takes, all-or-nothing, on a scratch copy.
  local scratch, ok, res = {}, true, {}
  for k = i, j do
    if flags[k] == 0 then
      local key = KEYS[k]
      local tat = scratch[key]
      if tat == nil then tat = committed(key) end
      local allowed, new, _, retry = decide(k, tat, false)
      res[k] = {allowed, retry}
      if allowed then scratch[key] = new else ok = false end
    end
  end
  for k = i, j do
    if flags[k] == 0 then
      local key = KEYS[k]
      local leased = 0
      if ok then
        local tat = scratch[key]
        tat, leased = lease(k, tat)
        scratch[key] = tat
        if tat ~= tats[key] then tats[key], dirty[key] = tat, true end
      end
      res[k][3] = leased
    end
  end
  for k = i, j do
    if flags[k] == 0 then
      report(k, res[k][1], res[k][3], res[k][2], committed(KEYS[k]))
    end
  end

  -- Gives and independent takes, each alone.
  for k = i, j do
    local f = flags[k]
    if f ~= 0 then
      local key = KEYS[k]
      local tat = committed(key)
      local allowed, new, _, retry = decide(k, tat, f == 1)
      local leased = 0
      if allowed and f == 2 then new, leased = lease(k, new) end
      if allowed and new ~= tat then tats[key], dirty[key] = new, true end
      report(k, allowed, leased, retry, committed(key))
    end
  end
  i = j + 1
end

local nowms = floor(now / 1000)
for key in pairs(dirty) do
  local tat = tats[key]
  local ttl = ceil(tat / 1000) - nowms
  if ttl < 1 then ttl = 1 end
  local px = ttl + math.min(ttl, SLACK)
  redis.call('SET', key, pack('<d', tat), 'PX', string.format('%d', px))
end

return table.concat(out)
