"""The Lua scripts behind `RedisState`: every change to fleet state is one atomic script.

Redis runs a script alone, so a script's reads and writes cannot interleave with another
worker's. Time is Redis's own clock (``TIME``), the one clock every worker shares; the
workers' loop clocks are never compared with each other.

Keys live under one hash tag, ``{prefix}``, so a cluster keeps them in one slot::

    {p}:pacer:leases      ZSET lease id -> expiry (ms)         concurrency slots in use
    {p}:pacer:rpm         ZSET grant id -> grant time (ms)     the 60 s request window
    {p}:pacer:tpm         ZSET grant id -> grant time (ms)     the 60 s token window
    {p}:pacer:tpm:amt     HASH grant id -> tokens
    {p}:pacer:tpm:used    STRING sum of tpm:amt
    {p}:pacer:agents      ZSET agent -> virtual start time of its next grant (waiting)
    {p}:pacer:finish      HASH agent -> virtual finish time of its last grant
    {p}:pacer:q:<agent>   ZSET waiter id -> arrival number      one FIFO queue per agent
    {p}:pacer:waiters     ZSET "<agent>\\n<waiter id>" -> expiry (ms)
    {p}:pacer:seq         STRING arrival counter
    {p}:pacer:vtime       STRING virtual time of the last grant
    {p}:pacer:aimd        HASH limit, epoch, successes, overloads
    {p}:cb:<upstream>     HASH state, failures, successes, open_until, probe, probe_until
    {p}:inflight:procs    ZSET process id -> expiry (ms)       processes publishing calls
    {p}:inflight:p:<id>   STRING JSON, expires (PX)            one process's in-flight table

Fairness is start-time fair queuing over agents: the agent with the smallest start time is
served, and the fleet's virtual time becomes that start time; a grant's finish time is its
start plus 1/weight, and the agent's next start is that finish, or the virtual time if
that is later (an agent that waited for nothing does not bank credit). With equal weights
that is round robin across the whole fleet: between two grants to an agent that stays
queued, every other agent gets at most one. Waiters and leases carry expiry times, so a
worker that dies holding either blocks nobody past that time.
"""

from __future__ import annotations

__all__ = [
    "BREAKER_ADMIT",
    "BREAKER_RECORD",
    "FLEET_ADMIT",
    "INFLIGHT_PUBLISH",
    "INFLIGHT_READ",
    "INFLIGHT_REMOVE",
    "PACER_ACQUIRE",
    "PACER_LEAVE",
    "PACER_RELEASE",
]

# Shared by the pacer scripts: the clock, and dropping what has expired.
_PACER_PRELUDE = """
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function each_chunk(list, fn)
  for i = 1, #list, 500 do
    fn({unpack(list, i, math.min(i + 499, #list))})
  end
end

local dead = redis.call('ZRANGEBYSCORE', P .. ':waiters', '-inf', now)
for _, m in ipairs(dead) do
  local sep = string.find(m, '\\n', 1, true)
  local a, w = string.sub(m, 1, sep - 1), string.sub(m, sep + 1)
  redis.call('ZREM', P .. ':q:' .. a, w)
  if redis.call('ZCARD', P .. ':q:' .. a) == 0 then redis.call('ZREM', P .. ':agents', a) end
end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', P .. ':waiters', '-inf', now) end

redis.call('ZREMRANGEBYSCORE', P .. ':leases', '-inf', now)
redis.call('ZREMRANGEBYSCORE', P .. ':rpm', '-inf', now - 60000)
local old = redis.call('ZRANGEBYSCORE', P .. ':tpm', '-inf', now - 60000)
if #old > 0 then
  each_chunk(old, function(c)
    local s = 0
    for _, v in ipairs(redis.call('HMGET', P .. ':tpm:amt', unpack(c))) do
      s = s + (tonumber(v) or 0)
    end
    redis.call('DECRBY', P .. ':tpm:used', s)
    redis.call('HDEL', P .. ':tpm:amt', unpack(c))
  end)
  redis.call('ZREMRANGEBYSCORE', P .. ':tpm', '-inf', now - 60000)
end
"""

#: ARGV: prefix, waiter id, agent, weight, tokens, max_concurrent (0: none), rpm (0: none),
#: tpm (0: none), lease ms, waiter ms, adaptive (0/1).
#: Returns {1, 0, epoch} granted; {0, ms} the caller's turn, capacity frees in ms;
#: {0, -1} not its turn yet; {0, -2} its turn, all concurrency slots leased.
_PACER_ACQUIRE_FN = """
local function pacer_acquire()
local wid, agent, weight = ARGV[2], ARGV[3], tonumber(ARGV[4])
local tokens, maxc = tonumber(ARGV[5]), tonumber(ARGV[6])
local rpm, tpm = tonumber(ARGV[7]), tonumber(ARGV[8])
local lease_ms, waiter_ms, adaptive = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11] == '1'
local q = P .. ':q:' .. agent

if not redis.call('ZSCORE', q, wid) then
  redis.call('ZADD', q, redis.call('INCR', P .. ':seq'), wid)
  if not redis.call('ZSCORE', P .. ':agents', agent) then
    local v = tonumber(redis.call('GET', P .. ':vtime') or '0')
    local f = tonumber(redis.call('HGET', P .. ':finish', agent) or '0')
    redis.call('ZADD', P .. ':agents', math.max(v, f), agent)
  end
end
redis.call('ZADD', P .. ':waiters', now + waiter_ms, agent .. '\\n' .. wid)

local turn = redis.call('ZRANGE', P .. ':agents', 0, 0, 'WITHSCORES')
if turn[1] ~= agent or redis.call('ZRANGE', q, 0, 0)[1] ~= wid then return {0, -1} end

local epoch = tonumber(redis.call('HGET', P .. ':aimd', 'epoch') or '0')
if maxc > 0 then
  local limit = maxc
  if adaptive then limit = tonumber(redis.call('HGET', P .. ':aimd', 'limit') or maxc) end
  if redis.call('ZCARD', P .. ':leases') >= math.floor(limit + 1e-9) then return {0, -2} end
end

local ready = now
if rpm > 0 then
  local n, cap = redis.call('ZCARD', P .. ':rpm'), math.floor(rpm)
  if n >= cap then
    local e = redis.call('ZRANGE', P .. ':rpm', n - cap, n - cap, 'WITHSCORES')
    ready = math.max(ready, tonumber(e[2]) + 60000)
  end
end
if tpm > 0 then
  local used = tonumber(redis.call('GET', P .. ':tpm:used') or '0')
  local excess = used + math.min(tokens, tpm) - tpm
  if excess > 0 then
    local log = redis.call('ZRANGE', P .. ':tpm', 0, -1, 'WITHSCORES')
    for i = 1, #log, 2 do
      if excess <= 0 then break end
      excess = excess - tonumber(redis.call('HGET', P .. ':tpm:amt', log[i]) or '0')
      ready = math.max(ready, tonumber(log[i + 1]) + 60000)
    end
  end
end
if ready > now then return {0, ready - now} end

redis.call('ZREM', q, wid)
redis.call('ZREM', P .. ':waiters', agent .. '\\n' .. wid)
local finish = tonumber(turn[2]) + 1 / weight
redis.call('SET', P .. ':vtime', turn[2])
redis.call('HSET', P .. ':finish', agent, finish)
if redis.call('ZCARD', q) == 0 then
  redis.call('ZREM', P .. ':agents', agent)
else
  redis.call('ZADD', P .. ':agents', finish, agent)
end
if maxc > 0 then
  redis.call('ZADD', P .. ':leases', now + lease_ms, wid)
end
if rpm > 0 then redis.call('ZADD', P .. ':rpm', now, wid) end
if tpm > 0 then
  redis.call('ZADD', P .. ':tpm', now, wid)
  redis.call('HSET', P .. ':tpm:amt', wid, tokens)
  redis.call('INCRBY', P .. ':tpm:used', tokens)
end
return {1, 0, epoch}
end
"""
PACER_ACQUIRE = _PACER_PRELUDE + _PACER_ACQUIRE_FN + "return pacer_acquire()\n"

#: ARGV: prefix, waiter id, agent. A waiter that gave up leaves its queue.
PACER_LEAVE = (
    _PACER_PRELUDE
    + """
local wid, agent = ARGV[2], ARGV[3]
local q = P .. ':q:' .. agent
redis.call('ZREM', q, wid)
redis.call('ZREM', P .. ':waiters', agent .. '\\n' .. wid)
if redis.call('ZCARD', q) == 0 then redis.call('ZREM', P .. ':agents', agent) end
return 1
"""
)

#: ARGV: prefix, lease id, release (0: report an overload only), used tokens (-1: keep the
#: estimate), overloaded, succeeded, refund (0/1 each), max_concurrent, adaptive (0/1),
#: min_concurrent, decrease_factor, increase_step, the AIMD epoch the lease was granted in.
#: The epoch comes from the caller, not from Redis: an attempt's overload report and the
#: call's release go out as separate background operations, on connections of their own,
#: and Redis may run the release first.
#: Returns the adaptive limit after the change (-1 without one).
PACER_RELEASE = (
    _PACER_PRELUDE
    + """
local id, release, used = ARGV[2], ARGV[3] == '1', tonumber(ARGV[4])
local overloaded, succeeded, refund = ARGV[5] == '1', ARGV[6] == '1', ARGV[7] == '1'
local maxc, adaptive, minc = tonumber(ARGV[8]), ARGV[9] == '1', tonumber(ARGV[10])
local factor, step, granted = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])

if release then
  redis.call('ZREM', P .. ':leases', id)
  if refund then
    redis.call('ZREM', P .. ':rpm', id)
    used = 0
  end
  if used >= 0 and redis.call('ZSCORE', P .. ':tpm', id) then
    local before = tonumber(redis.call('HGET', P .. ':tpm:amt', id) or '0')
    redis.call('HSET', P .. ':tpm:amt', id, used)
    redis.call('INCRBY', P .. ':tpm:used', used - before)
  end
end
if not adaptive or maxc <= 0 then return -1 end
local A = P .. ':aimd'
local limit = tonumber(redis.call('HGET', A, 'limit') or maxc)
local epoch = tonumber(redis.call('HGET', A, 'epoch') or '0')
if overloaded then
  redis.call('HINCRBY', A, 'overloads', 1)
  if granted == epoch then
    limit = math.max(minc, math.floor(limit * factor + 1e-9))
    redis.call('HSET', A, 'limit', limit, 'epoch', epoch + 1, 'successes', 0)
  end
elseif succeeded and limit < maxc then
  local s = redis.call('HINCRBY', A, 'successes', 1)
  if s >= math.max(1, math.floor(limit + 1e-9)) then
    limit = math.min(limit + step, maxc)
    redis.call('HSET', A, 'limit', limit, 'successes', 0)
  end
end
return tostring(limit)
"""
)

# Shared by the breaker scripts.
_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
_BREAKER_PRELUDE = (
    """
local K = ARGV[1]
"""
    + _CLOCK
    + """
local function left(name)
  return math.max(0, tonumber(redis.call('HGET', K, name) or '0') - now)
end
"""
)

# The admission as a function of its key, ticket and probe ms (after a clock).
_BREAKER_ADMIT_FN = """
local function breaker_admit(K, id, probe_ms)
local function left(name)
  return math.max(0, tonumber(redis.call('HGET', K, name) or '0') - now)
end
local state = redis.call('HGET', K, 'state') or 'closed'
if state == 'open' then
  local wait = left('open_until')
  if wait > 0 then return {'refuse', wait, state} end
  state = 'half-open'
  redis.call('HSET', K, 'state', state, 'successes', 0)
elseif state == 'half-open' and left('probe_until') > 0 then
  return {'refuse', 0, state}
end
if state == 'half-open' then
  redis.call('HSET', K, 'probe', id, 'probe_until', now + probe_ms)
  return {'probe', 0, state}
end
return {'go', 0, state}
end
"""

#: ARGV: key, ticket id, probe ms (how long a probe may hold the half-open slot).
#: Returns {verdict, ms, state}: verdict 'go' (closed), 'probe' (this ticket is the one
#: probe), 'refuse' (ms until a probe may go; 0 while one runs); state after admission.
BREAKER_ADMIT = (
    _CLOCK + _BREAKER_ADMIT_FN + "return breaker_admit(ARGV[1], ARGV[2], tonumber(ARGV[3]))\n"
)

#: A call's admission when its pacer and its breaker share one `RedisState`: one round
#: trip. ARGV: `PACER_ACQUIRE`'s 11, then `BREAKER_ADMIT`'s 3. The breaker is asked only
#: once the pacer grants (as the two scripts in turn would): returns `PACER_ACQUIRE`'s
#: answer, and on a grant the breaker's {verdict, ms, state} after it (6 items).
FLEET_ADMIT = (
    _PACER_PRELUDE
    + _PACER_ACQUIRE_FN
    + _BREAKER_ADMIT_FN
    + """
local r = pacer_acquire()
if r[1] == 1 then
  local v = breaker_admit(ARGV[12], ARGV[13], tonumber(ARGV[14]))
  r[4], r[5], r[6] = v[1], v[2], v[3]
end
return r
"""
)

#: ARGV: key, ticket id, outcome ('success', 'failure' or 'release'), open ms (-1: the
#: policy's reset_timeout; else a Retry-After, already clamped), fail_max, reset ms,
#: success_threshold. Returns {state, ms until a probe may go}.
BREAKER_RECORD = (
    _BREAKER_PRELUDE
    + """
local id, outcome, open_ms = ARGV[2], ARGV[3], tonumber(ARGV[4])
local fail_max, reset_ms, needed = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local state = redis.call('HGET', K, 'state') or 'closed'
if redis.call('HGET', K, 'probe') == id then redis.call('HDEL', K, 'probe', 'probe_until') end
local function open(ms)
  state = 'open'
  redis.call('HSET', K, 'state', state, 'open_until', now + ms, 'failures', 0, 'successes', 0)
end
if outcome == 'release' then
  -- no news about the upstream
elseif open_ms >= 0 then
  open(open_ms)
elseif state == 'open' then
  -- an attempt admitted before the circuit opened: no news
elseif outcome == 'failure' then
  if state == 'half-open' then
    open(reset_ms)
  elseif redis.call('HINCRBY', K, 'failures', 1) >= fail_max then
    open(reset_ms)
  end
elseif state == 'half-open' then
  if redis.call('HINCRBY', K, 'successes', 1) >= needed then
    state = 'closed'
    redis.call('HSET', K, 'state', state, 'failures', 0, 'successes', 0)
  end
else
  redis.call('HSET', K, 'failures', 0)
end
return {state, left('open_until')}
"""
)

# The in-flight tables of `stallproof top` (`_publish`): each process's table is a key that
# expires by itself, so a dead process's calls disappear within its ttl; the index of
# processes carries the same expiry as scores, on Redis's clock.
_INFLIGHT_PRELUDE = """
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local procs = P .. ':inflight:procs'
"""

#: ARGV: prefix, process id, table (JSON), ttl ms. Returns 1.
INFLIGHT_PUBLISH = (
    _INFLIGHT_PRELUDE
    + """
local id, ttl = ARGV[2], tonumber(ARGV[4])
redis.call('SET', P .. ':inflight:p:' .. id, ARGV[3], 'PX', ttl)
redis.call('ZADD', procs, now + ttl, id)
redis.call('ZREMRANGEBYSCORE', procs, '-inf', now)
if redis.call('PTTL', procs) < ttl then redis.call('PEXPIRE', procs, ttl) end
return 1
"""
)

#: ARGV: prefix, most processes. Returns {processes publishing, table, ms left, table,
#: ms left, ...} for at most that many of them.
INFLIGHT_READ = (
    _INFLIGHT_PRELUDE
    + """
redis.call('ZREMRANGEBYSCORE', procs, '-inf', now)
local out = {redis.call('ZCARD', procs)}
for _, id in ipairs(redis.call('ZRANGE', procs, 0, tonumber(ARGV[2]) - 1)) do
  local k = P .. ':inflight:p:' .. id
  local v = redis.call('GET', k)
  if v then
    out[#out + 1] = v
    out[#out + 1] = redis.call('PTTL', k)
  end
end
return out
"""
)

#: ARGV: prefix, process id. Returns 1.
INFLIGHT_REMOVE = (
    _INFLIGHT_PRELUDE
    + """
redis.call('DEL', P .. ':inflight:p:' .. ARGV[2])
redis.call('ZREM', procs, ARGV[2])
return 1
"""
)
