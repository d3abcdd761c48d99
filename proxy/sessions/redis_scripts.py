"""The Lua scripts of the Redis store (`store.RedisStore`): each touches the keys of one
session, or of one shard of the index of recent sessions (`recent`), so that a Redis Cluster
runs it on one node."""

# KEYS: state, fence. ARGV: expected version, data, TTL ms, fence token or "".
COMPARE_AND_SET = """
if ARGV[4] ~= '' and tonumber(redis.call('GET', KEYS[2]) or '0') > tonumber(ARGV[4]) then
  return 0
end
local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if version ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'v', version + 1, 'd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return version + 1
"""

# KEYS: state, fence. ARGV: who, turns, compactions, saved (to add), lines (to append),
# lines kept, TTL ms. The state's fields `w`, `n`, `c`, `s`, `t` beside its `v` and `d`.
ADD_TURNS = """
redis.call('HSET', KEYS[1], 'w', ARGV[1])
local n = redis.call('HINCRBY', KEYS[1], 'n', ARGV[2])
local c = redis.call('HINCRBY', KEYS[1], 'c', ARGV[3])
local s = redis.call('HINCRBY', KEYS[1], 's', ARGV[4])
local lines = ARGV[5]
local old = redis.call('HGET', KEYS[1], 't')
if old and old ~= '' then
  lines = old .. '\\n' .. lines
end
local ends, from = {}, 1
while true do
  local at = string.find(lines, '\\n', from, true)
  if not at then break end
  ends[#ends + 1] = at
  from = at + 1
end
local over = #ends + 1 - tonumber(ARGV[6])
if over > 0 then
  lines = string.sub(lines, ends[over] + 1)
end
redis.call('HSET', KEYS[1], 't', lines)
redis.call('PEXPIRE', KEYS[1], ARGV[7])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[7]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
end
local record = redis.call('HMGET', KEYS[1], 'v', 'd')
return {n, c, s, record[1], record[2]}
"""

# KEYS: lock, fence. ARGV: lock TTL ms, fence TTL ms.
# A token is the master's clock in microseconds, or the newest token + 1 when that is not
# above it: a failover that loses the newest writes to the fence cannot hand a token out again
# (as long as the new master's clock is no further behind than the failover took).
ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local time = redis.call('TIME')
local now = time[1] .. string.format('%06d', tonumber(time[2]))
local newest = redis.call('GET', KEYS[2])
local token = now
if newest and tonumber(newest) >= tonumber(now) then
  token = redis.call('INCR', KEYS[2])
else
  redis.call('SET', KEYS[2], now)
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[1])
return tonumber(token)
"""

# KEYS: lock. ARGV: token.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: order, rows. ARGV: session key, time, row, rows kept in the shard, TTL ms, the time
# before which a row is gone.
LIST = """
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
if old and tonumber(old) > tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[6])
local over = redis.call('ZCARD', KEYS[1]) - #gone - tonumber(ARGV[4])
if over > 0 then
  gone = redis.call('ZRANGE', KEYS[1], 0, #gone + over - 1)
end
if #gone > 0 then
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('HDEL', KEYS[2], unpack(gone))
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"""
