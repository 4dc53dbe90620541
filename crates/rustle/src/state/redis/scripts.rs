//! The Lua scripts of the Redis backend: each is one atomic step on the server (a check
//! and an update no other instance can come between), called by its SHA-1.

use std::fmt::Write as _;

use sha1::{Digest, Sha1};

/// A Lua script and its SHA-1, called by `EVALSHA` (loaded by `EVAL` when Redis does not
/// know it: after a restart, or the first time).
pub(super) struct Script {
    pub(super) body: &'static str,
    pub(super) sha: String,
}

impl Script {
    pub(super) fn new(body: &'static str) -> Script {
        let mut sha = String::with_capacity(40);
        for b in Sha1::digest(body.as_bytes()) {
            // Writing to a String cannot fail.
            let _ = write!(sha, "{b:02x}");
        }
        Script { body, sha }
    }
}

/// A batch of additions (KEYS[2..], amounts and TTLs in ARGV[2..] by pairs), unless the
/// batch (KEYS[1]) was counted already; the batch remembered for `ARGV[1]` ms. The
/// counters' values after, either way.
pub(super) const ADD: &str = r"
local fresh = redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1])
local out = {}
for k = 2, #KEYS do
  local amount, ttl = ARGV[2 * k - 2], ARGV[2 * k - 1]
  if fresh then
    out[k - 1] = redis.call('INCRBY', KEYS[k], amount)
    redis.call('PEXPIRE', KEYS[k], ttl)
  else
    out[k - 1] = tonumber(redis.call('GET', KEYS[k]) or '0')
  end
end
return out
";

/// Each counter (KEYS) raised to at least its amount (ARGV by pairs with TTLs); the
/// values after.
pub(super) const RAISE: &str = r"
local out = {}
for k = 1, #KEYS do
  local amount, ttl = tonumber(ARGV[2 * k - 1]), ARGV[2 * k]
  local now = tonumber(redis.call('GET', KEYS[k]) or '0')
  if now < amount then
    redis.call('SET', KEYS[k], ARGV[2 * k - 1], 'PX', ttl)
    now = amount
  end
  out[k] = now
end
return out
";

/// The session's value if it has one, else `ARGV[1]`, set for `ARGV[2]` ms.
pub(super) const STICKY: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
";

/// This instance's lease (KEYS[1]) renewed for `ARGV[2]` ms, and its connections per user
/// (KEYS[2..], counts in ARGV[3..]) set in each user's hash (a count of 0 removes the
/// field), whose expiry is moved later if the lease ends after it (never earlier: another
/// instance's lease may be longer).
pub(super) const PUBLISH: &str = r"
local ms = tonumber(ARGV[2])
redis.call('SET', KEYS[1], 1, 'PX', ms)
for k = 2, #KEYS do
  local n = tonumber(ARGV[k + 1])
  if n == 0 then
    redis.call('HDEL', KEYS[k], ARGV[1])
  else
    redis.call('HSET', KEYS[k], ARGV[1], n)
    if redis.call('PTTL', KEYS[k]) < ms then redis.call('PEXPIRE', KEYS[k], ms) end
  end
end
return 0
";

/// Each user's (KEYS) connections summed over the instances whose lease (`ARGV[1]` and
/// the instance) is alive; the fields of the others removed.
pub(super) const CONNS: &str = r"
local out = {}
for k = 1, #KEYS do
  local f = redis.call('HGETALL', KEYS[k])
  local total = 0
  for i = 1, #f, 2 do
    if redis.call('EXISTS', ARGV[1] .. f[i]) == 1 then
      total = total + tonumber(f[i + 1])
    else
      redis.call('HDEL', KEYS[k], f[i])
    end
  end
  out[k] = total
end
return out
";

/// A user's client addresses (KEYS[1], address → last seen): those idle for `ARGV[1]` ms
/// dropped, then each address (ARGV[4..]) admitted if known or if fewer than `ARGV[2]`
/// are, and marked seen now (the server's clock). 1 admitted, 0 refused. The user (its
/// escaped name `ARGV[3]`) goes in the index of users with addresses (KEYS[2]), its TTL
/// in the index's hash of TTLs (KEYS[3]), for `FLEET_ADDRS`.
pub(super) const ADDRS: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
local out = {}
for i = 4, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) or redis.call('ZCARD', KEYS[1]) < max then
    redis.call('ZADD', KEYS[1], now, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if redis.call('ZCARD', KEYS[1]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('SADD', KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[3], ttl)
  for k = 2, 3 do
    if redis.call('PTTL', KEYS[k]) < ttl then redis.call('PEXPIRE', KEYS[k], ttl) end
  end
end
return out
";

/// A whole tick of connection counts: this instance's lease (KEYS[1]) renewed for
/// `ARGV[2]` ms, its count for each user given (ARGV[5..]: escaped name, count) set in the
/// user's hash (`ARGV[4]` and the name) and the user put in the index of users with
/// connections (KEYS[2]); its field removed from the hashes of the index's other users.
/// Then every indexed user's total over the live leases (`ARGV[3]` and the instance), the
/// dead fields and the users left with none removed. Returns name, total, name, total...
pub(super) const SYNC_CONNS: &str = r"
local me = ARGV[1]
local ms = tonumber(ARGV[2])
redis.call('SET', KEYS[1], 1, 'PX', ms)
local mine = {}
for i = 5, #ARGV, 2 do
  local key = ARGV[4] .. ARGV[i]
  redis.call('HSET', key, me, ARGV[i + 1])
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
  redis.call('SADD', KEYS[2], ARGV[i])
  mine[ARGV[i]] = true
end
if redis.call('PTTL', KEYS[2]) < ms then redis.call('PEXPIRE', KEYS[2], ms) end
local out = {}
for _, u in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local key = ARGV[4] .. u
  if not mine[u] then redis.call('HDEL', key, me) end
  local f = redis.call('HGETALL', key)
  local total = 0
  for i = 1, #f, 2 do
    if redis.call('EXISTS', ARGV[3] .. f[i]) == 1 then
      total = total + tonumber(f[i + 1])
    else
      redis.call('HDEL', key, f[i])
    end
  end
  if total == 0 then
    redis.call('SREM', KEYS[2], u)
  else
    out[#out + 1] = u
    out[#out + 1] = tostring(total)
  end
end
return out
";

/// Every indexed user's (KEYS[1]: escaped names) client addresses (`ARGV[1]` and the
/// name: address -> last seen) seen within the user's TTL (its hash field `ARGV[2]`
/// .. name, in ms); users with none left removed. Returns name, address count, the
/// addresses, name, ...
pub(super) const FLEET_ADDRS: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, u in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. u
  local ttl = tonumber(redis.call('HGET', KEYS[2], u) or '0')
  local a = redis.call('ZRANGEBYSCORE', key, now - ttl, '+inf')
  if #a == 0 then
    redis.call('SREM', KEYS[1], u)
    redis.call('HDEL', KEYS[2], u)
  else
    out[#out + 1] = u
    out[#out + 1] = tostring(#a)
    for i = 1, #a do out[#out + 1] = a[i] end
  end
end
return out
";
