-- token_bucket.lua: refill + check + take for sluice's global token buckets.
--
-- Representation (GCRA). A bucket is one string value: its "theoretical
-- arrival time" TAT, in microseconds of Redis' own clock (TIME), then the
-- key's expiry (below), in milliseconds, then the interval (below) and
-- burst of the limit it was last written under, as four little-endian IEEE
-- 754 doubles (struct.pack '<dddd', 32 bytes): exact, and cheaper than printing
-- and parsing the TAT with %.17g (glibc's exact float conversions dominated
-- the script's profile). Any other value (the 16-byte '<dd' of earlier
-- builds included) reads as a full bucket. With
-- interval = period / requests (microseconds per token) and tau = burst *
-- interval, a bucket at time now holds burst - max(TAT - now, 0) / interval
-- tokens. A missing key is a full bucket. Taking c tokens moves TAT to
-- max(TAT, now) + c * interval; giving c back moves it to
-- max(TAT - c * interval, now). One value (not a tokens +
-- timestamp hash) keeps each bucket to one GET and one SET, and the refill
-- needs no write: time passing is the refill.
--
-- A changed limit. A bucket key is its rule and values, not its numbers, so
-- a key may come with another limit (interval or burst) than its value was
-- written under: after a rule change, and on every call while nodes run
-- different limits for one rule. The tokens it lacks at now stay lacking,
-- all of them: with debt = TAT - now > 0 at the old interval, the bucket
-- lacks D = debt / old interval tokens and is read as TAT' = now + D *
-- interval, D never clamped to the new burst. A take then needs D + cost
-- <= burst, so a bucket that took more than a lowered burst refuses (and
-- reports 0 remaining) until the excess refilled. Clamping would forgive
-- the excess, again at each switch from a larger burst to a smaller one:
-- nodes that disagree would admit far beyond either limit. So D only grows
-- by takes within the caller's burst and falls at the rate of whoever
-- wrote last: what is admitted over T is at most the largest burst plus
-- the largest rate times T (docs/design.md). A bucket converted so is
-- written back (under its new limit, D unchanged) whatever the key's
-- decision, also for a check or a refused take, so that it refills at the
-- new rate from then on; backend/memory does the same in integers.
--
-- KEYS[i]     bucket key i (i = 1..n), all in one slot in Redis Cluster.
--             Or, when ARGV has more than one value, KEYS[1] only routes the
--             call and the bucket keys are ARGV[2..n+1]: in Redis Cluster,
--             one call then serves buckets of every slot of one master
--             (Redis allows scripts without flags to touch undeclared keys
--             of other slots on the node; a key the node does not serve
--             fails the call before anything is written).
-- ARGV[1]     48 bytes per key: six little-endian IEEE 754 doubles (binary,
--             not decimal text: parsing 6n decimal arguments with strtod was
--             a tenth of the script's CPU, and formatting them a cost to the
--             client). For key i, at byte 48(i-1) + 1:
--   decision  decision number. One call may carry several decisions (a
--             batch of concurrent requests); the keys of one decision are
--             contiguous, and neighbouring decisions have different numbers
--             (the client numbers them 1, 2, ... in call order).
--   period    in microseconds (> 0)
--   requests  tokens added per period (0 = never allowed)
--   burst     capacity in tokens
--   cost      tokens to take, or to give back; 0 = check only (refused only
--             when the bucket is in debt, lacking more than burst; takes
--             nothing)
--   flags     0 = take, 1 = give back, 2 = independent take, 3 = independent
--             give back, 6 = independent take that overdraws: refused when
--             the tokens lack, it takes them all the same, into debt (a
--             post-charge): TAT moves to max(TAT, now) + cost * interval,
--             at most now + 2 * tau (one burst of debt), never below where
--             it was (a converted bucket may lack more already)
--
-- Semantics, per decision: the takes (flags 0) are all-or-nothing: they take
-- their tokens only when every one of them is allowed. Then the gives and
-- independent takes are applied one by one, each decided alone; a give is
-- always allowed and never fills a bucket beyond its burst. Requests 0 is
-- never allowed (a give to it does nothing). Decisions apply in order, each
-- seeing the buckets the ones before it left.
--
-- Reply: one string of 40 bytes per key (a string, not an array, so that
-- the client reads one value per call instead of 5n): five little-endian
-- doubles, each an integer in [0, 2^53), for key i at byte 40(i-1) + 1:
--   allowed   1 or 0
--   remaining whole tokens left after the decision
--   retry     for a refused key, microseconds until its bucket, as the key
--             left it, lacks at most burst - cost tokens (until it is full
--             when cost > burst, one period when requests is 0), rounded
--             up; 0 when allowed
--   reset     microseconds until the bucket is full again, rounded up (one
--             period when requests is 0)
--   next      when remaining is 0, microseconds until one whole token exists,
--             rounded down (the caller caches empty buckets until then); 0
--             otherwise
--
-- TTL rule: a key outlives its bucket's refill (its TAT) by at most its time
-- to refill or SLACK milliseconds, whichever is less. A write keeps the
-- key's TTL (KEEPTTL) when the expiry it records is still at or after the
-- new TAT, and otherwise sets PX to that bound: a bucket in use changes its
-- TTL about once per SLACK instead of on every write (setting a TTL was a
-- third of a write's cost). Bounding the slack by the refill time keeps
-- short-lived keys short-lived: buckets that refill within milliseconds,
-- each given a whole extra second, filled Redis with keys expiring in bulk,
-- and its active expiry then blocked it for up to 25 ms (LATENCY LATEST,
-- spread keys at 1,000,000 per second). The expiry
-- recorded is MARGIN earlier than the one set: Redis may count PX from the
-- script's start (7.2 and later), a little before TIME, and a call of
-- maxCallKeys buckets runs under 2 ms. Keys only read are not written.

if redis.replicate_commands then
  redis.replicate_commands() -- Redis < 5: replicate effects, as TIME requires
end

-- Written for speed: Redis runs this for every bucket of every request, so
-- the per-key path avoids helper calls and never converts numbers to or
-- from text (glibc's exact float conversions behind tonumber, %.17g and
-- Redis' own formatting of number arguments dominated the profile), reads
-- the arguments and packs the reply with one struct call per CHUNK keys,
-- rounds with % where that is exact rather than calling math.floor and
-- math.ceil, decides the common decisions (one key, or takes of distinct
-- buckets) in line, without calls (TestScriptInline holds that path equal
-- to the general one, byte for byte), and allocates no table per key or
-- decision. Decisions are not merged: N decisions on one bucket are N
-- sequential steps, as their replies differ and must match the general
-- path's float arithmetic exactly.
local EPS = 1 -- microseconds of slack that absorb floating-point rounding
local SLACK = 1000 -- milliseconds a key may outlive its bucket's refill
local MARGIN = 5 -- milliseconds between the expiry set and the one recorded
local MAXINT = 9007199254740991 -- 2^53 - 1: larger replies would overflow
local EXACT = 4503599627370496 -- 2^52: below it, x % 1 is exact for x >= 0
local CHUNK = 64 -- keys per struct call: bounds the Lua stack
local floor, ceil, fmt, rep = math.floor, math.ceil, string.format, string.rep
local A = ARGV[1] or ''
local pack, sunpack, tunpack = struct.pack, struct.unpack, unpack

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowms = floor(now / 1000)

local K, o = KEYS, 0 -- bucket key k is K[k + o]
if #ARGV > 1 then K, o = ARGV, 1 end
local n = #K - o
if #A ~= 48 * n then
  return redis.error_reply('token_bucket.lua: ARGV[1] has ' .. #A .. ' bytes, want 48 per key')
end

-- R[6k-5 .. 6k]: key k's decision, period, requests, burst, cost, flags.
local R = {}
do
  local k = 1
  while k <= n do
    local m = n - k + 1
    if m > CHUNK then m = CHUNK end
    local v = { sunpack('<' .. rep('d', 6 * m), A, 48 * k - 47) }
    if k == 1 and m == n then
      R = v -- one chunk: v[6n + 1], unpack's next position, is never read
    else
      local p = 6 * k - 6
      for x = 1, 6 * m do R[p + x] = v[x] end
    end
    k = k + m
  end
end

-- The buckets of the call: key k is bucket S[k], its first key KB[b].
-- TAT[b] is bucket b's committed TAT, EXP[b] the expiry its value records
-- (when it has one), IV[b] and BU[b] the interval its TAT is measured in
-- and the burst of the limit it was last written under, DIRTY[b] whether
-- it is to be written.
local S, KB, TAT, EXP, IV, BU, DIRTY = {}, {}, {}, {}, {}, {}, {}
local nb = 0
do
  local seen = {}
  for k = 1, n do
    local key = K[k + o]
    local b = seen[key]
    if b == nil then
      nb = nb + 1
      b = nb
      seen[key], KB[b] = b, key
    end
    S[k] = b
  end
  for b = 1, nb do
    local s = redis.call('GET', KB[b])
    if s and #s == 32 then
      TAT[b], EXP[b], IV[b], BU[b] = sunpack('<dddd', s)
    else
      TAT[b] = 0
    end
  end
end

local V = {} -- V[5k-4 .. 5k]: key k's reply, five integers

-- report fills the reply of key k for a bucket at tat.
local function report(k, allowed, retry, tat, interval, tau, burst)
  local debt = tat - now
  if debt < 0 then debt = 0 end
  local remaining = (tau - debt + EPS) / interval
  if remaining >= 0 and remaining < EXACT then
    remaining = remaining - remaining % 1 -- floor, without a C call
  else
    remaining = floor(remaining)
  end
  if remaining > burst then remaining = burst end
  local nxt = 0
  if not (remaining >= 1) then -- also NaN
    if not (remaining >= 0) then remaining = 0 end
    nxt = floor(debt + interval - tau - EPS)
    if not (nxt >= 0) then nxt = 0 elseif nxt > MAXINT then nxt = MAXINT end
  elseif remaining > MAXINT then
    remaining = MAXINT
  end
  if retry ~= 0 then retry = ceil(retry) end -- 0 when allowed
  if debt < EXACT then
    local f = debt % 1 -- ceil, without a C call (debt >= 0, or NaN)
    if f > 0 then debt = debt - f + 1 end
  else
    debt = ceil(debt)
  end
  if retry > MAXINT then retry = MAXINT end
  if debt > MAXINT then debt = MAXINT end
  local q = 5 * k - 5
  V[q + 1], V[q + 2], V[q + 3], V[q + 4], V[q + 5] = allowed and 1 or 0, remaining, retry, debt, nxt
end

-- decide applies key k to a bucket at tat, written under interval iv and
-- burst bu, fills its reply and returns whether it is allowed, the bucket's
-- TAT if it is, and, when the bucket was written under another limit, its
-- TAT converted to key k's limit (nil otherwise) with that limit's interval
-- and burst.
local function decide(k, tat, iv, bu, give)
  local p = 6 * k - 4
  local period, requests, burst, cost = R[p], R[p + 1], R[p + 2], R[p + 3]
  if requests <= 0 then
    local q = 5 * k - 5
    if give then
      V[q + 1], V[q + 2], V[q + 3], V[q + 4], V[q + 5] = 1, 0, 0, 0, 0
    else
      V[q + 1], V[q + 2], V[q + 3], V[q + 4], V[q + 5] = 0, 0, period, period, period
    end
    return give, tat
  end
  local interval = period / requests
  local tau = burst * interval
  local conv = nil
  if tat > now and (iv ~= interval or bu ~= burst) then
    if iv ~= interval then tat = now + (tat - now) / iv * interval end
    conv = tat
  end
  local base = tat
  if base < now then base = now end
  local allowed, retry = true, 0
  local new = tat
  if give then
    new = base - cost * interval
    if new < now then new = now end
  else
    local wait = base + cost * interval - tau - now -- > 0: tokens missing
    if cost > burst or wait > EPS then
      allowed = false
      if R[p + 4] >= 4 then -- overdraw: into debt, at most one burst
        new = base + cost * interval
        if new > now + 2 * tau then new = now + 2 * tau end
        if new < base then new = base end
        base = new
        wait = new + cost * interval - tau - now
      end
      if cost > burst then retry = base - now else retry = wait end
    else
      new = base + cost * interval
    end
  end
  if new <= now and tat <= now then
    new = tat -- full before and after: nothing to write
  end
  report(k, allowed, retry, new, interval, tau, burst)
  return allowed, new, conv, interval, burst
end

-- alone decides key k by itself (a give, an independent take, or the one
-- take of its decision) on its bucket's committed TAT, and commits it.
local function alone(k, give)
  local b = S[k]
  local tat = TAT[b]
  local _, new, conv, civ, cbu = decide(k, tat, IV[b], BU[b], give)
  if conv then TAT[b], IV[b], BU[b], DIRTY[b] = conv, civ, cbu, true; tat = conv end
  -- (a refused key leaves new at tat, unless it overdrew)
  if new ~= tat then TAT[b], IV[b], BU[b], DIRTY[b] = new, civ, cbu, true end
end

-- Scratch state of one decision's takes, by bucket, emptied after each.
local scratch, siv, sbu, granted = {}, {}, {}, {}
-- The in-line path's TAT of each allowed key (false: nothing to commit),
-- and the decision that last met each bucket.
local NEW, MARK = {}, {}

local i = 1
while i <= n do
  local d = R[6 * i - 5]
  local j = i
  while j < n and R[6 * j + 1] == d do j = j + 1 end

  -- Most decisions are one key, or takes of distinct buckets: they run in
  -- line below, the general path's decide and report written out (calls
  -- cost the most here). For them the general path below comes to this:
  -- each key decided on its bucket's committed TAT (converted, and the
  -- conversion kept, when its limit changed), then every allowed TAT
  -- committed if all are allowed, else the allowed keys reported on the
  -- untouched buckets. TestScriptInline checks that both paths agree.
  local inline = true
  if j > i then
    for k = i, j do
      local b = S[k]
      if R[6 * k] ~= 0 or MARK[b] == i then
        inline = false
        break
      end
      MARK[b] = i
    end
  end

  if inline then
    local ok = true
    for k = i, j do
      local b, p = S[k], 6 * k - 4
      local period, requests, burst, cost, f = R[p], R[p + 1], R[p + 2], R[p + 3], R[p + 4]
      local q = 5 * k - 5
      if requests <= 0 then
        NEW[k] = false
        if f % 2 == 1 then
          V[q + 1], V[q + 2], V[q + 3], V[q + 4], V[q + 5] = 1, 0, 0, 0, 0
        else
          V[q + 1], V[q + 2], V[q + 3], V[q + 4], V[q + 5] = 0, 0, period, period, period
          ok = false
        end
      else
        local tat = TAT[b]
        local interval = period / requests
        local tau = burst * interval
        if tat > now and (IV[b] ~= interval or BU[b] ~= burst) then
          if IV[b] ~= interval then tat = now + (tat - now) / IV[b] * interval end
          TAT[b], IV[b], BU[b], DIRTY[b] = tat, interval, burst, true
        end
        local base = tat
        if base < now then base = now end
        local allowed, retry = true, 0
        local new = tat
        if f % 2 == 1 then
          new = base - cost * interval
          if new < now then new = now end
        else
          local wait = base + cost * interval - tau - now -- > 0: tokens missing
          if cost > burst or wait > EPS then
            allowed = false
            if f >= 4 then -- overdraw: into debt, at most one burst
              new = base + cost * interval
              if new > now + 2 * tau then new = now + 2 * tau end
              if new < base then new = base end
              base = new
              wait = new + cost * interval - tau - now
            end
            if cost > burst then retry = base - now else retry = wait end
          else
            new = base + cost * interval
          end
        end
        if new <= now and tat <= now then
          new = tat -- full before and after: nothing to write
        end
        if not allowed then
          NEW[k], ok = false, false
          if new ~= tat then -- overdrew (one key, a flag: never in a batch of takes)
            TAT[b], IV[b], BU[b], DIRTY[b] = new, interval, burst, true
          end
        elseif i < j then
          NEW[k] = new
        elseif new ~= tat then -- one key: its decision is final
          TAT[b], IV[b], BU[b], DIRTY[b] = new, interval, burst, true
        end
        -- report(k, allowed, retry, new, interval, tau, burst):
        local debt = new - now
        if debt < 0 then debt = 0 end
        local remaining = (tau - debt + EPS) / interval
        if remaining >= 0 and remaining < EXACT then
          remaining = remaining - remaining % 1
        else
          remaining = floor(remaining)
        end
        if remaining > burst then remaining = burst end
        local nxt = 0
        if not (remaining >= 1) then
          if not (remaining >= 0) then remaining = 0 end
          nxt = floor(debt + interval - tau - EPS)
          if not (nxt >= 0) then nxt = 0 elseif nxt > MAXINT then nxt = MAXINT end
        elseif remaining > MAXINT then
          remaining = MAXINT
        end
        if retry ~= 0 then retry = ceil(retry) end
        if debt < EXACT then
          local x = debt % 1
          if x > 0 then debt = debt - x + 1 end
        else
          debt = ceil(debt)
        end
        if retry > MAXINT then retry = MAXINT end
        if debt > MAXINT then debt = MAXINT end
        V[q + 1], V[q + 2], V[q + 3], V[q + 4], V[q + 5] = allowed and 1 or 0, remaining, retry, debt, nxt
      end
    end
    if i < j then -- (one key's decision is committed already)
      for k = i, j do
        local new = NEW[k]
        if new then
          local b, p = S[k], 6 * k - 4
          if not ok then
            -- Nothing taken: allowed takes report the untouched bucket.
            local period, requests, burst = R[p], R[p + 1], R[p + 2]
            local interval = period / requests
            report(k, true, 0, TAT[b], interval, burst * interval, burst)
          elseif new ~= TAT[b] then
            TAT[b], IV[b], BU[b], DIRTY[b] = new, R[p] / R[p + 1], R[p + 2], true
          end
        end
      end
    end
  else
    -- The takes of decision d (flags 0), all-or-nothing, on a scratch copy
    -- (scratch TATs measured in siv). A conversion of the committed bucket
    -- is kept whatever the decision.
    local ok = true
    for k = i, j do
      if R[6 * k] == 0 then
        local b = S[k]
        local tat, iv, bu = scratch[b], siv[b], sbu[b]
        local fresh = tat == nil
        if fresh then tat, iv, bu = TAT[b], IV[b], BU[b] end
        local allowed, new, conv, civ, cbu = decide(k, tat, iv, bu, false)
        granted[k] = allowed
        if conv and fresh then TAT[b], IV[b], BU[b], DIRTY[b] = conv, civ, cbu, true end
        if allowed then scratch[b], siv[b], sbu[b] = new, civ, cbu else ok = false end
      end
    end
    for k = i, j do
      if R[6 * k] == 0 then
        local b = S[k]
        if ok then
          local tat = scratch[b]
          if tat ~= TAT[b] then TAT[b], IV[b], BU[b], DIRTY[b] = tat, siv[b], sbu[b], true end
        elseif granted[k] then
          -- Nothing taken: allowed takes report the untouched bucket.
          local p = 6 * k - 4
          local period, requests, burst = R[p], R[p + 1], R[p + 2]
          local interval = period / requests
          report(k, true, 0, TAT[b], interval, burst * interval, burst)
        end
      end
    end

    -- Gives and independent takes, each decided alone.
    for k = i, j do
      local f = R[6 * k]
      if f ~= 0 then
        alone(k, f % 2 == 1)
      else
        local b = S[k]
        scratch[b], siv[b], sbu[b] = nil, nil, nil
      end
    end
  end
  i = j + 1
end

for b = 1, nb do
  if DIRTY[b] then
    local key, tat = KB[b], TAT[b]
    local full = tat / 1000 -- ms, rounded up:
    if full >= 0 and full < EXACT then
      local x = full % 1
      if x > 0 then full = full - x + 1 end
    else
      full = ceil(full)
    end
    local exp = EXP[b]
    local iv, bu = IV[b], BU[b]
    if exp and exp >= full then
      redis.call('SET', key, pack('<dddd', tat, exp, iv, bu), 'KEEPTTL')
    else
      local ttl = full - nowms
      local px = ttl + math.min(math.max(ttl, 1), SLACK)
      redis.call('SET', key, pack('<dddd', tat, nowms + px - MARGIN, iv, bu), 'PX', fmt('%d', px))
    end
  end
end

-- The reply, packed CHUNK keys at a time.
if n <= CHUNK then
  return pack('<' .. rep('d', 5 * n), tunpack(V, 1, 5 * n))
end
local out = {}
local k = 1
while k <= n do
  local m = n - k + 1
  if m > CHUNK then m = CHUNK end
  out[#out + 1] = pack('<' .. rep('d', 5 * m), tunpack(V, 5 * k - 4, 5 * k + 5 * m - 5))
  k = k + m
end
return table.concat(out)
