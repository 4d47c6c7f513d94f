-- token_bucket.lua: refill + check + take for sluice's global token buckets.
--
-- Representation (GCRA). A bucket is one string value: its "theoretical
-- arrival time" TAT, in microseconds of Redis' own clock (TIME), written with
-- %.17g so a double round-trips exactly. With interval = period / requests
-- (microseconds per token) and tau = burst * interval, a bucket at time now
-- holds burst - max(TAT - now, 0) / interval tokens. A missing key is a full
-- bucket. Taking c tokens moves TAT to max(TAT, now) + c * interval; giving c
-- back moves it to max(TAT - c * interval, now). One value (not a tokens +
-- timestamp hash) keeps each bucket to one GET and one SET, and the refill
-- needs no write: time passing is the refill.
--
-- KEYS[i]     bucket key i (i = 1..n); in Redis Cluster all keys of a call
--             share one slot.
-- ARGV, six values per key, for key i at 6i-5 .. 6i:
--   6i-5      decision number. One call may carry several decisions (a
--             batch of concurrent requests); the keys of one decision are
--             contiguous, and neighbouring decisions have different numbers
--             (the client numbers them 1, 2, ... in call order).
--   6i-4      period in microseconds (> 0)
--   6i-3      requests: tokens added per period (0 = never allowed)
--   6i-2      burst: capacity in tokens
--   6i-1      cost: tokens to take, or to give back; 0 = check only (allowed
--             when at least one token is left, takes nothing)
--   6i        flags: 0 = take, 1 = give back, 2 = independent take,
--             3 = independent give back
--
-- Semantics, per decision: the takes (flags 0) are all-or-nothing: they take
-- their tokens only when every one of them is allowed. Then the gives and
-- independent takes are applied one by one, each decided alone; a give is
-- always allowed and never fills a bucket beyond its burst. Requests 0 is
-- never allowed (a give to it does nothing). Decisions apply in order, each
-- seeing the buckets the ones before it left.
--
-- Reply: one string of 5n non-negative decimal integers separated by single
-- spaces (a string, not an array of integers, so that the client reads one
-- value per call instead of 5n; integers below 2^53 print exactly with %d),
-- for key i the (5i-4)th to the 5i-th:
--   5i-4      allowed: 1 or 0
--   5i-3      remaining: whole tokens left after the decision
--   5i-2      retry: for a refused key, microseconds until cost tokens exist
--             (until the bucket is full when cost > burst, one period when
--             requests is 0), rounded up; 0 when allowed
--   5i-1      reset: microseconds until the bucket is full again, rounded up
--             (one period when requests is 0)
--   5i        next: when remaining is 0, microseconds until one whole token
--             exists, rounded down (the caller caches empty buckets until
--             then); 0 otherwise
--
-- TTL rule: every key written gets PX = its time to refill fully, in
-- milliseconds, rounded up, at least 1. Keys only read are not written.

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: replicate effects, as TIME requires
end

local EPS = 1 -- microseconds of slack that absorb floating-point rounding
local MAXINT = 9007199254740991 -- 2^53 - 1: larger replies would overflow

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local n = #KEYS
local tats = {} -- committed TAT per key, read once
local dirty = {}
local reply = {}

local function committed(key)
  local v = tats[key]
  if v == nil then
    v = tonumber(redis.call('GET', key) or '') or 0
    tats[key] = v
  end
  return v
end

local function clamp(x, hi)
  if x ~= x or x < 0 then return 0 end -- x ~= x: NaN
  if x > hi then return hi end
  return x
end

local function param(i)
  local a = 6 * (i - 1)
  return tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
    tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
end

-- report fills the reply of key i for a bucket at tat.
local function report(i, allowed, retry, tat, interval, tau, burst)
  local debt = math.max(tat - now, 0)
  local remaining = clamp(math.floor((tau - debt + EPS) / interval), burst)
  local nxt = 0
  if remaining < 1 then
    nxt = clamp(math.floor(debt + interval - tau - EPS), MAXINT)
  end
  local o = 5 * (i - 1)
  reply[o + 1] = allowed and 1 or 0
  reply[o + 2] = clamp(remaining, MAXINT)
  reply[o + 3] = clamp(math.ceil(retry), MAXINT)
  reply[o + 4] = clamp(math.ceil(debt), MAXINT)
  reply[o + 5] = nxt
end

-- decide applies key i to a bucket at tat, fills its reply and returns
-- whether it is allowed and the bucket's TAT if it is.
local function decide(i, tat)
  local period, requests, burst, cost, flags = param(i)
  local give = flags % 2 == 1
  if requests <= 0 then
    local o = 5 * (i - 1)
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5] =
      give and 1 or 0, 0, give and 0 or period, give and 0 or period,
      give and 0 or period
    return give, tat
  end
  local interval = period / requests
  local tau = burst * interval
  local base = math.max(tat, now)
  local allowed, retry = true, 0
  local new = tat
  if give then
    new = math.max(base - cost * interval, now)
  elseif cost > burst then
    allowed, retry = false, base - now
  else
    local need = math.max(cost, 1)
    local wait = base + need * interval - tau - now -- > 0: tokens missing
    if wait > EPS then
      allowed, retry = false, wait
    else
      new = base + cost * interval
    end
  end
  if new <= now and tat <= now then
    new = tat -- full before and after: nothing to write
  end
  report(i, allowed, retry, new, interval, tau, burst)
  return allowed, new
end

local i = 1
while i <= n do
  local d = ARGV[6 * (i - 1) + 1]
  local j = i
  while j < n and ARGV[6 * j + 1] == d do j = j + 1 end

  -- The takes of decision d, all-or-nothing, on a scratch copy.
  local scratch, ok = {}, true
  for k = i, j do
    if tonumber(ARGV[6 * k]) == 0 then
      local key = KEYS[k]
      local allowed, new = decide(k, scratch[key] or committed(key))
      if allowed then scratch[key] = new else ok = false end
    end
  end
  if ok then
    for key, tat in pairs(scratch) do
      if tat ~= tats[key] then tats[key], dirty[key] = tat, true end
    end
  else
    -- Nothing taken: allowed takes report the untouched bucket.
    for k = i, j do
      if tonumber(ARGV[6 * k]) == 0 and reply[5 * (k - 1) + 1] == 1 then
        local period, requests, burst = param(k)
        local interval = period / requests
        report(k, true, 0, committed(KEYS[k]), interval, burst * interval, burst)
      end
    end
  end

  -- Gives and independent takes, each decided alone.
  for k = i, j do
    if tonumber(ARGV[6 * k]) ~= 0 then
      local key = KEYS[k]
      local tat = committed(key)
      local allowed, new = decide(k, tat)
      if allowed and new ~= tat then tats[key], dirty[key] = new, true end
    end
  end
  i = j + 1
end

for k = 1, n do
  local key = KEYS[k]
  if dirty[key] then
    dirty[key] = nil
    local tat = tats[key]
    local ttl = math.max(math.ceil((tat - now) / 1000), 1)
    redis.call('SET', key, string.format('%.17g', tat), 'PX', ttl)
  end
end

local out = {}
for k = 1, n do
  local o = 5 * (k - 1)
  out[k] = string.format('%d %d %d %d %d',
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5])
end
return table.concat(out, ' ')
