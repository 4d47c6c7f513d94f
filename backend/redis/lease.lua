-- lease.lua: take, lease and give back tokens of sluice's leased global
-- buckets (package backend/lease) in one call.
--
-- Representation (GCRA), as token_bucket.lua's but in keys of their own
-- ("<prefix>:lease:{<hash>}"): a bucket is one string value, its
-- "theoretical arrival time" TAT in microseconds of Redis' clock (TIME),
-- then the key's expiry in milliseconds (recorded, not read), then the
-- interval (below) and burst of the limit it was last written under, as
-- four little-endian IEEE 754 doubles (struct.pack '<dddd', 32 bytes, the
-- layout of token_bucket.lua's values). Any other value (the 8-byte '<d'
-- TAT of earlier builds included), or none, is a full bucket. A bucket
-- with tokens out in leases appends five doubles (72 bytes; the 32-byte
-- value of a bucket with none, and of earlier builds, reads as none out):
--   window  µs: grants are counted for at least this long (the largest
--           window of the ops since the count was last empty)
--   start   µs of Redis' clock: the current window began then
--   pstart  µs: the previous window began then (start when it is empty)
--   cur     tokens leased since start and not unparked
--   prev    tokens leased in [pstart, start) and not unparked
-- An op first moves the windows on: from start + window on, prev takes
-- cur and a new window begins at start + window (both are dropped from
-- start + 2 window on). cur + prev is then an upper bound of the tokens
-- parked in leases: a node spends a lease's tokens for at most half the
-- window after the call that took it (ARGV window: 2 x its lease period),
-- and a return closes a node's pool of leases: its tokens are spent or
-- given back (ARGV since, unpark).
--
-- With interval = period / requests and tau = burst * interval, a bucket
-- at time now holds burst - max(TAT - now, 0) / interval tokens. Taking c tokens
-- moves TAT to max(TAT, now) + c * interval; giving c back moves it to
-- max(TAT - c * interval, now), so a bucket is never above its burst.
-- A give and a return clamp instead at burst - (cur + prev): the fleet's
-- bucket is Redis' plus the tokens parked in leases, and exact mode
-- clamps that at the burst (a give never removes tokens: a bucket already
-- above the clamp stays as it is).
--
-- A changed limit, as token_bucket.lua: a key may come with another limit
-- (interval or burst) than its value was written under, after a rule
-- change or while nodes disagree on a rule. The tokens it lacks at now
-- stay lacking, all of them: with debt = TAT - now > 0 at the old
-- interval, the bucket lacks D = debt / old interval tokens and is read as
-- TAT' = now + D * interval, D never clamped to the new burst (that would
-- forgive the excess at each switch to a smaller burst). A take or a lease
-- needs D + tokens <= the caller's burst, so a bucket beyond a lowered
-- burst refuses takes and checks, leases nothing and reports 0 remaining
-- until the excess refilled. Any op
-- under another limit (take, check, lease, give, independent take)
-- converts the bucket and writes it back under its limit, D unchanged,
-- whatever the decision. Except a return (flags 3): tokens a node leased
-- under a limit the bucket no longer has are not given back; they are
-- lost, never admitted (a conversion would forgive nothing, but a return
-- must not switch the bucket back to the old limit's rate, and dropping is
-- the conservative side). The parked count (cur + prev) is in tokens,
-- whatever the limit, and a give's clamp at burst - (cur + prev) never
-- lowers D, so neither interacts with a conversion.
--
-- KEYS[i]   bucket key i (i = 1..n), all in one slot in Redis Cluster. Or,
--           when ARGV has more than one value, as token_bucket.lua: KEYS[1]
--           only routes the call and the bucket keys are ARGV[2..n+1]; in
--           Redis Cluster one call then serves buckets of every slot of one
--           master (Redis allows scripts without flags to touch undeclared
--           keys of other slots on the node). A key the node does not serve
--           fails the call before anything is written: every op reads its
--           bucket (GET) before the SETs at the end.
-- ARGV[1]   96 bytes per key: twelve little-endian doubles. For key i, at
--           byte 96(i-1) + 1:
--   decision  decision number; the keys of one decision are contiguous and
--             neighbouring decisions have different numbers
--   period    in microseconds (> 0)
--   requests  tokens added per period (0 = never allowed)
--   burst     capacity in tokens
--   need      the key is allowed when its bucket lacks at most burst - need
--             tokens: 0 for a check or a prefetch, refused only in debt
--             (lacking more than burst)
--   take      tokens taken when the decision is allowed (<= need)
--   extra     at most this many more whole tokens are leased once the
--             decision is allowed: floor(tokens left / share), capped here
--   share     > 0: the divisor of the lease (2 x live nodes)
--   flags     0 = take (all-or-nothing within the decision), 1 = give back
--             take tokens (never refused), 2 = independent take (decided
--             alone), 3 = return take leased tokens (a give, but nothing
--             when the bucket was written under another limit), 6 = an
--             independent take that overdraws: refused when the bucket
--             lacks need, it takes take tokens all the same, into debt (a
--             post-charge; TAT at most now + 2 * tau, one burst of debt,
--             and never below where it was), and leases nothing
--   window    µs a lease of this call may stay parked, at most (0: none)
--   since     a return: µs of Redis' clock of the first grant of the
--             node's pool it closes (the reply's granted), 0 if none
--   unpark    a return: tokens the pool was granted (spent or given back
--             now); they leave cur + prev when since >= pstart, prev first
--
-- Reply: one string, 48 bytes per key, six little-endian doubles, each an
-- integer in [0, 2^53), the bucket as key i's limit sees it:
--   allowed   1 or 0
--   leased    whole tokens leased to the caller beyond take
--   remaining whole tokens left in Redis after the key
--   retry     for a refused key, microseconds until its bucket, as the key
--             left it, allows need (until it is full when need > burst),
--             rounded up
--   reset     microseconds until Redis' bucket is full, rounded up
--   granted   when leased > 0, Redis' clock (µs) at the grant, else 0
--
-- Semantics per decision: first its takes, all-or-nothing on a scratch
-- copy; leases only for an allowed decision; then gives, returns and
-- independent takes one by one. Requests 0: takes refused (retry and reset
-- one period), gives do nothing. A written key expires when its bucket is
-- full again, plus the time to refill or a second, whichever is less.

if redis.replicate_commands then
  redis.replicate_commands()
end

local EPS = 1
local SLACK = 1000
local MAXINT = 9007199254740991
local floor, ceil = math.floor, math.ceil
local pack, unpack = struct.pack, struct.unpack
local A = ARGV[1] or ''
local W = 96

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- KEYS, from here on, is the bucket keys: Redis' KEYS, or ARGV[2..n+1].
local KEYS = KEYS
if #ARGV > 1 then
  KEYS = {}
  for k = 2, #ARGV do KEYS[k - 1] = ARGV[k] end
end
local n = #KEYS
if #A ~= W * n then
  return redis.error_reply('lease.lua: ARGV[1] has ' .. #A .. ' bytes, want 96 per key')
end

-- Each key's arguments, unpacked once (struct.unpack per use was the
-- script's largest cost after its Redis calls): op k's decision D, period
-- PER, requests REQ, burst BUR, need NEED, take TAKE, extra EXTRA, share
-- SHARE, flags F, window WIN, since SINCE, unpark UNP; and its limit's
-- interval IV (nil for requests 0) and tau TAU.
local D, PER, REQ, BUR, NEED, TAKE, EXTRA, SHARE, F, WIN, SINCE, UNP = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local IV, TAU = {}, {}
for k = 1, n do
  D[k], PER[k], REQ[k], BUR[k], NEED[k], TAKE[k], EXTRA[k], SHARE[k], F[k], WIN[k], SINCE[k], UNP[k] =
    unpack('<dddddddddddd', A, W * (k - 1) + 1)
  if REQ[k] > 0 then
    IV[k] = PER[k] / REQ[k]
    TAU[k] = BUR[k] * IV[k]
  end
end

local tats, ivs, bursts, dirty, out = {}, {}, {}, {}, {}
-- parks[key] is a counted bucket's {window, start, pstart, cur, prev}; nil
-- when nothing is counted (parked makes one).
local parks = {}

-- committed returns key's TAT, read once, and the interval and burst it
-- is measured in (nil when the value records none: a full bucket).
local function committed(key)
  local v = tats[key]
  if v == nil then
    local s = redis.call('GET', key)
    local _
    if s and (#s == 32 or #s == 72) then v, _, ivs[key], bursts[key] = unpack('<dddd', s) else v = 0 end
    if s and #s == 72 then
      local p = {unpack('<ddddd', s, 33)}
      p[6] = nil
      parks[key] = p
    end
    tats[key] = v
  end
  return v, ivs[key], bursts[key]
end

-- parked moves key's windows on to now under a window of at least w and
-- returns them (key read by committed).
local function parked(key, w)
  local p = parks[key]
  if p == nil then
    p = {w, now, now, 0, 0}
    parks[key] = p
    return p
  end
  if p[4] <= 0 and p[5] <= 0 then
    p[1], p[2], p[3], p[4], p[5] = w, now, now, 0, 0
    return p
  end
  if w > p[1] then p[1] = w end
  if p[1] > 0 and now >= p[2] + p[1] then
    if now < p[2] + 2 * p[1] then
      p[3], p[2], p[5] = p[2], p[2] + p[1], p[4]
    else
      p[3], p[2], p[5] = now, now, 0
    end
    p[4] = 0
    dirty[key] = true
  end
  return p
end

-- unpark takes the tokens u of a pool first granted at since out of
-- key's count, when the count still holds them.
local function unpark(key, w, since, u)
  local p = parked(key, w)
  if u <= 0 or since <= 0 or since < p[3] or (p[4] <= 0 and p[5] <= 0) then return end
  local s = math.min(u, p[5])
  p[5] = p[5] - s
  p[4] = math.max(p[4] - (u - s), 0)
  dirty[key] = true
end

-- convert returns tat, measured under interval iv and burst bu, under
-- interval and burst: the tokens it lacks stay lacking, all of them, also
-- beyond burst (never clamped: that would forgive them).
local function convert(tat, iv, bu, interval, burst)
  if tat > now and (iv ~= interval or bu ~= burst) then
    if iv ~= interval then tat = now + (tat - now) / iv * interval end
    return tat, true
  end
  return tat, false
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

-- grant counts l tokens leased from key by key k.
local function grant(key, k, l)
  if l <= 0 then return end
  local p = parked(key, WIN[k])
  p[4] = p[4] + l
  dirty[key] = true
end

-- clampgive raises new, key k's TAT after a give from tat (both under
-- key k's limit), to what the tokens parked in leases leave: the fleet
-- holds at most the burst. It never lowers the bucket below tat's.
local function clampgive(k, key, tat, new)
  local interval = IV[k]
  if interval == nil or new >= tat then return new end
  local p = parked(key, WIN[k])
  local low = now + (p[4] + p[5]) * interval
  local base = tat
  if base < now then base = now end
  if low > base then low = base end
  if new < low then return low end
  return new
end

-- overdraw returns the TAT of a refused take of key k's take tokens from
-- base (>= now) that overdraws: into debt, at most one burst, never below
-- base; and the reply's retry for it.
local function overdraw(k, base)
  local interval, tau = IV[k], TAU[k]
  local new = base + TAKE[k] * interval
  if new > now + 2 * tau then new = now + 2 * tau end
  if new < base then new = base end
  if NEED[k] > BUR[k] then return new, new - now end
  return new, new + NEED[k] * interval - tau - now
end

-- decide applies key k to tat, measured under iv and bu (not the leases),
-- and returns allowed, the new TAT, the reply fields but leased, and, when
-- tat was measured under another limit than key k's, tat converted to it
-- (nil otherwise). Both TATs are then measured under key k's limit. With
-- ov set, a refused take overdraws.
local function decide(k, tat, iv, bu, give, ov)
  local interval, burst, need, take = IV[k], BUR[k], NEED[k], TAKE[k]
  if interval == nil then
    if give then return true, tat, 0, 0, 0 end
    return false, tat, 0, PER[k], PER[k]
  end
  local tau = TAU[k]
  local conv = nil
  local c, changed = convert(tat, iv, bu, interval, burst)
  if changed then tat, conv = c, c end
  local base = tat
  if base < now then base = now end
  if give then
    local new = base - take * interval
    if new < now then new = now end
    if tat <= now then new = tat end
    return true, new, 0, 0, 0, conv
  end
  local wait = base + need * interval - tau - now
  if need > burst or wait > EPS then
    if ov then
      local new, retry = overdraw(k, base)
      return false, new, 0, retry, new - now, conv
    end
    if need > burst then wait = base - now end
    return false, tat, 0, wait, base - now, conv
  end
  if take > 0 then return true, base + take * interval, 0, 0, 0, conv end
  return true, tat, 0, 0, 0, conv
end

-- lease takes key k's lease from tat (measured under key k's limit) and
-- returns the new TAT and leased.
local function lease(k, tat)
  local interval, burst, extra = IV[k], BUR[k], EXTRA[k]
  if interval == nil or extra <= 0 then return tat, 0 end
  local r = tokens(tat, interval, TAU[k], burst)
  local l = floor(r / SHARE[k])
  if l > extra then l = extra end
  if l <= 0 then return tat, 0 end
  local base = tat
  if base < now then base = now end
  return base + l * interval, l
end

-- report fills key k's reply for key's committed bucket, as key k's limit
-- sees it.
local function report(k, allowed, leased, retry, key)
  local interval, burst = IV[k], BUR[k]
  local remaining, reset = 0, PER[k]
  if interval ~= nil then
    local tat, iv, bu = committed(key)
    tat = convert(tat, iv, bu, interval, burst)
    remaining, reset = tokens(tat, interval, TAU[k], burst)
  end
  local granted = 0
  if leased > 0 then granted = now end
  out[k] = pack('<dddddd', allowed and 1 or 0, leased, remaining, clamp(ceil(retry)), clamp(ceil(reset)), granted)
end

-- store commits tat, measured under key k's limit, as key's bucket.
local function store(key, k, tat)
  tats[key], ivs[key], bursts[key], dirty[key] = tat, IV[k], BUR[k], true
end

-- The takes' scratch copy: scratch[key] is valid for the decision that
-- starts at op i when stamp[key] == i (one set of tables for the call, not
-- one per decision). Op k's take result: RA[k] allowed, RR[k] retry, RL[k]
-- leased (RA and RR the in-line path's too, for any op).
local scratch, siv, sbu, stamp = {}, {}, {}, {}
local RA, RR, RL = {}, {}, {}
-- The in-line path's: MARK[key] is the decision (its first op) that last
-- met key; NEW[k] is op k's TAT once decided, before its lease (false:
-- reported).
local MARK, NEW = {}, {}

local i = 1
while i <= n do
  local d = D[i]
  local j = i
  while j < n and D[j + 1] == d do j = j + 1 end

  -- Most decisions are one op, or takes of distinct buckets: they run in
  -- line below, the general path's decide, lease, clampgive and report
  -- written out (calls cost the most here). For them the general path
  -- comes to this: each op decided on its bucket's committed TAT
  -- (converted, and the conversion kept, when its limit changed), then,
  -- for one op or when every take is allowed, the allowed takes' leases
  -- and the new TATs committed; the allowed takes of a refused decision
  -- report the untouched buckets. Every report reads the committed TAT,
  -- which is under the op's limit then, but for a return of another
  -- limit's tokens (it calls report). The parked count keeps its helpers.
  -- TestLeaseInline checks that both paths agree.
  local inline = true
  if j > i then
    for k = i, j do
      local key = KEYS[k]
      if F[k] ~= 0 or MARK[key] == i then
        inline = false
        break
      end
      MARK[key] = i
    end
  end

  if inline then
    local ok = true
    for k = i, j do
      local key, f = KEYS[k], F[k]
      local tat = tats[key]
      if tat == nil then tat = committed(key) end
      local iv, bu = ivs[key], bursts[key]
      local interval, burst = IV[k], BUR[k]
      if f == 3 then unpark(key, WIN[k], SINCE[k], UNP[k]) end
      if f == 3 and tat > now and (iv ~= interval or bu ~= burst) then
        report(k, true, 0, 0, key)
        NEW[k] = false -- reported
      else
        local allowed, retry, new = true, 0, tat
        local give = f == 1 or f == 3
        if interval == nil then
          if not give then allowed, retry = false, PER[k] end
        else
          local tau, take = TAU[k], TAKE[k]
          if tat > now and (iv ~= interval or bu ~= burst) then
            if iv ~= interval then tat = now + (tat - now) / iv * interval end
            tats[key], ivs[key], bursts[key], dirty[key] = tat, interval, burst, true
            new = tat
          end
          local base = tat
          if base < now then base = now end
          if give then
            new = base - take * interval
            if new < now then new = now end
            if tat <= now then new = tat end
            if new < tat then -- clampgive
              local p = parked(key, WIN[k])
              local low = now + (p[4] + p[5]) * interval
              if low > base then low = base end
              if new < low then new = low end
            end
          else
            local need = NEED[k]
            local wait = base + need * interval - tau - now
            if need > burst or wait > EPS then
              allowed = false
              if f == 6 then -- overdraw
                new = base + take * interval
                if new > now + 2 * tau then new = now + 2 * tau end
                if new < base then new = base end
                if need > burst then retry = new - now else retry = new + need * interval - tau - now end
              elseif need > burst then
                retry = base - now
              else
                retry = wait
              end
            elseif take > 0 then
              new = base + take * interval
            end
          end
        end
        if not allowed then ok = false end
        RA[k], RR[k], NEW[k] = allowed, retry, new
      end
    end
    for k = i, j do
      local new = NEW[k] -- false: reported
      if new then
        local key, interval, burst = KEYS[k], IV[k], BUR[k]
        local allowed, leased = RA[k], 0
        if i == j or ok then
          local extra, f = EXTRA[k], F[k]
          if allowed and f ~= 1 and f ~= 3 and not (extra <= 0) then
            -- lease(k, new):
            local debt = new - now
            if debt < 0 then debt = 0 end
            local r = floor((TAU[k] - debt + EPS) / interval)
            if r > burst then r = burst end
            if not (r >= 0) then r = 0 elseif r > MAXINT then r = MAXINT end
            local l = floor(r / SHARE[k])
            if l > extra then l = extra end
            if not (l <= 0) then
              local base = new
              if base < now then base = now end
              new, leased = base + l * interval, l
              local p = parked(key, WIN[k])
              p[4] = p[4] + l
              dirty[key] = true
            end
          end
          if new ~= tats[key] then tats[key], ivs[key], bursts[key], dirty[key] = new, interval, burst, true end
        end
        -- report(k, allowed, leased, RR[k], key):
        local remaining, reset, retry = 0, PER[k], ceil(RR[k])
        if interval ~= nil then
          local debt = tats[key] - now
          if debt < 0 then debt = 0 end
          remaining = floor((TAU[k] - debt + EPS) / interval)
          if remaining > burst then remaining = burst end
          if not (remaining >= 0) then remaining = 0 elseif remaining > MAXINT then remaining = MAXINT end
          reset = debt
        end
        reset = ceil(reset)
        if not (retry >= 0) then retry = 0 elseif retry > MAXINT then retry = MAXINT end
        if not (reset >= 0) then reset = 0 elseif reset > MAXINT then reset = MAXINT end
        local granted = 0
        if leased > 0 then granted = now end
        out[k] = pack('<dddddd', allowed and 1 or 0, leased, remaining, retry, reset, granted)
      end
    end
  else
    local flags = F

    -- Takes, all-or-nothing, on a scratch copy (scratch TATs measured under
    -- siv and sbu). A conversion of the committed bucket is kept whatever
    -- the decision.
    local ok = true
    for k = i, j do
      if flags[k] == 0 then
        local key = KEYS[k]
        local fresh = stamp[key] ~= i
        local tat, iv, bu
        if fresh then tat, iv, bu = committed(key) else tat, iv, bu = scratch[key], siv[key], sbu[key] end
        local allowed, new, _, retry, _, conv = decide(k, tat, iv, bu, false)
        if conv and fresh then store(key, k, conv) end
        RA[k], RR[k] = allowed, retry
        if allowed then
          scratch[key], stamp[key] = new, i
          siv[key], sbu[key] = IV[k], BUR[k]
        else
          ok = false
        end
      end
    end
    for k = i, j do
      if flags[k] == 0 then
        local key = KEYS[k]
        local leased = 0
        if ok then
          local interval, burst = IV[k], BUR[k]
          local tat = convert(scratch[key], siv[key], sbu[key], interval, burst)
          tat, leased = lease(k, tat)
          grant(key, k, leased)
          scratch[key], siv[key], sbu[key] = tat, interval, burst
          if tat ~= tats[key] or (tat > now and (interval ~= ivs[key] or burst ~= bursts[key])) then store(key, k, tat) end
        end
        RL[k] = leased
      end
    end
    for k = i, j do
      if flags[k] == 0 then
        report(k, RA[k], RL[k], RR[k], KEYS[k])
      end
    end

    -- Gives, returns and independent takes, each alone. A return (flags 3)
    -- of tokens leased under another limit than the bucket's does nothing.
    for k = i, j do
      local f = flags[k]
      local ov = f == 6
      if ov then f = 2 end
      if f ~= 0 then
        local key = KEYS[k]
        local tat, iv, bu = committed(key)
        local interval, burst = IV[k], BUR[k]
        if f == 3 then
          unpark(key, WIN[k], SINCE[k], UNP[k])
        end
        if f == 3 and tat > now and (iv ~= interval or bu ~= burst) then
          report(k, true, 0, 0, key)
        else
          local allowed, new, _, retry, _, conv = decide(k, tat, iv, bu, f ~= 2, ov)
          if conv then store(key, k, conv); tat = conv end
          local leased = 0
          if allowed and f == 2 then new, leased = lease(k, new); grant(key, k, leased) end
          if f ~= 2 then new = clampgive(k, key, tat, new) end
          -- (a refused key leaves new at tat, unless it overdrew)
          if new ~= tat then store(key, k, new) end
          report(k, allowed, leased, retry, key)
        end
      end
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
  local p = parks[key]
  local v
  if p and (p[4] > 0 or p[5] > 0) then
    -- The count lives until both windows are dropped.
    local keep = ceil((p[2] + 2 * p[1] - now) / 1000)
    if p[1] <= 0 then keep = 0 end
    if px < keep then px = keep end
    v = pack('<ddddddddd', tat, nowms + px, ivs[key], bursts[key], p[1], p[2], p[3], p[4], p[5])
  else
    v = pack('<dddd', tat, nowms + px, ivs[key], bursts[key])
  end
  redis.call('SET', key, v, 'PX', string.format('%d', px))
end

return table.concat(out)
