//! Client addresses per user (`max_client_addresses`, squid's `max_user_ip`): how many
//! distinct client addresses each user is using, across workers.
//!
//! An address is in use while one of the user's connections from it is open, and for the
//! TTL (`client_address_ttl`) after its last one closed; a user at its limit is refused
//! a further address until one of its addresses has been idle for the TTL.
//!
//! The whole interface is `Addrs::admit` and the `Hold` it gives (released when dropped):
//! a connection admits once, when it authenticates, never per request or stream, and
//! holds the `Hold` until it ends. A table shared by several instances (a store such as
//! Redis) would implement those two steps.
//!
//! In a fleet (`[state] backend = "redis"`), the fleet thread tells the table each tick
//! which addresses the other instances have for each user (`set_fleet`), and reads the
//! addresses in use here (`local`) to publish them: `admit` counts both, with no round
//! trip of its own. The other instances' addresses are as of the last tick, so a user may
//! use up to what other instances admitted within one tick beyond its limit.
//!
//! The table is sharded by user name (`SHARDS` mutexes), so that logins of different
//! users on different workers seldom meet on one lock. Memory is bounded: at most
//! `MAX_USERS` users are tracked at once (each entry holds the name and its addresses,
//! about 100 bytes plus 40 per address, so a few megabytes at most), and a user holds at
//! most as many addresses as its limit. A user leaves the table once all its addresses
//! have been idle for the TTL: lazily, when the user is next admitted, or when its shard
//! is full and is swept. A shard still full after its sweep refuses users it does not
//! track yet (`Refused::Full`): the limit is never lifted by filling the table.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Mutexes the table is split into: a few, so that two workers authenticating different
/// users rarely wait for each other; more would only cost memory (logins are rare next
/// to requests).
const SHARDS: usize = 8;

/// Users tracked at once, across shards (each shard takes its share). Far above the
/// users a deployment has active within a TTL; it only bounds what clients sending
/// arbitrary names (`accept_any_credentials`) could make the table hold.
pub(crate) const MAX_USERS: usize = 65_536;

/// A user's limit: distinct addresses in use at once, and how long an address stays in
/// use after its last connection closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) max: usize,
    pub(crate) ttl: Duration,
}

/// Why `admit` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The user already uses `in_use` other addresses, at or past its limit `max`.
    InUse { in_use: usize, max: usize },
    /// The table holds `MAX_USERS` users, none idle long enough to leave.
    Full,
}

/// One address of a user.
#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    /// Connections from it open now.
    open: u32,
    /// When its last connection closed (or it was admitted, while any is open).
    last: Instant,
}

/// A user's addresses, the limit its last admission was given, and the addresses the
/// rest of the fleet has for it (as of the last tick; none outside a fleet).
#[derive(Debug)]
struct UserAddrs {
    ttl: Duration,
    max: usize,
    addrs: Vec<Entry>,
    others: Vec<IpAddr>,
}

impl UserAddrs {
    fn is_empty(&self) -> bool {
        self.addrs.is_empty() && self.others.is_empty()
    }
}

impl UserAddrs {
    /// Drops the addresses idle for the TTL at `now`.
    fn expire(&mut self, now: Instant) {
        let ttl = self.ttl;
        self.addrs.retain(|e| e.open > 0 || now.saturating_duration_since(e.last) < ttl);
    }
}

type Shard = HashMap<Box<str>, UserAddrs>;

/// The table, shared by every worker (and kept across reloads).
#[derive(Debug)]
pub(crate) struct Addrs {
    shards: Box<[Mutex<Shard>]>,
    /// Users each shard tracks at most.
    per_shard: usize,
    hasher: std::collections::hash_map::RandomState,
}

/// One connection's use of an address; dropping it releases it (the address then stays
/// in use for the TTL).
#[must_use = "the address is released as soon as it is dropped"]
#[derive(Debug)]
pub(crate) struct Hold {
    table: Arc<Addrs>,
    user: Box<str>,
    ip: IpAddr,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.table.release(&self.user, self.ip, super::now());
    }
}

impl Addrs {
    pub(crate) fn new() -> Arc<Addrs> {
        Addrs::with_capacity(MAX_USERS)
    }

    /// A table tracking at most `max_users` users (rounded up to a multiple of the shards).
    pub(crate) fn with_capacity(max_users: usize) -> Arc<Addrs> {
        Arc::new(Addrs {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: max_users.div_ceil(SHARDS).max(1),
            hasher: Default::default(),
        })
    }

    fn shard(&self, user: &str) -> std::sync::MutexGuard<'_, Shard> {
        // Modulo of a hash: the result is below SHARDS, the slice's length.
        let i = (self.hasher.hash_one(user) % SHARDS as u64) as usize;
        super::lock(&self.shards[i])
    }

    /// `user`'s connection from `ip` at `now` under `limit`: a `Hold` to keep while the
    /// connection is open, or why not. IPv4-mapped IPv6 addresses count as their IPv4
    /// address. An address the user already uses is always admitted.
    pub(crate) fn admit(
        self: &Arc<Self>,
        user: &str,
        ip: IpAddr,
        limit: Limit,
        now: Instant,
    ) -> Result<Hold, Refused> {
        let ip = ip.to_canonical();
        let mut shard = self.shard(user);
        if !shard.contains_key(user) && shard.len() >= self.per_shard {
            sweep(&mut shard, now);
            if shard.len() >= self.per_shard {
                return Err(Refused::Full);
            }
        }
        let u = shard.entry(user.into()).or_insert_with(|| UserAddrs {
            ttl: limit.ttl,
            max: limit.max,
            addrs: Vec::new(),
            others: Vec::new(),
        });
        u.ttl = limit.ttl;
        u.max = limit.max;
        u.expire(now);
        let others = |u: &UserAddrs| {
            u.others.iter().filter(|o| !u.addrs.iter().any(|e| e.ip == **o)).count()
        };
        if let Some(e) = u.addrs.iter_mut().find(|e| e.ip == ip) {
            e.open += 1;
            e.last = now;
        } else if !u.others.contains(&ip) && u.addrs.len() + others(u) >= limit.max {
            let in_use = u.addrs.len() + others(u);
            if u.is_empty() {
                shard.remove(user);
            }
            return Err(Refused::InUse { in_use, max: limit.max });
        } else {
            u.addrs.push(Entry { ip, open: 1, last: now });
        }
        drop(shard);
        Ok(Hold { table: self.clone(), user: user.into(), ip })
    }

    /// One connection of `user` from `ip` closed at `now`.
    fn release(&self, user: &str, ip: IpAddr, now: Instant) {
        let mut shard = self.shard(user);
        let Some(u) = shard.get_mut(user) else { return };
        if let Some(e) = u.addrs.iter_mut().find(|e| e.ip == ip) {
            e.open = e.open.saturating_sub(1);
            e.last = now;
        }
        u.expire(now);
        if u.is_empty() {
            shard.remove(user);
        }
    }

    /// The addresses in use here (open, or idle for less than their TTL) of each user,
    /// with its limit: what the fleet thread publishes each tick.
    pub(crate) fn local(&self, now: Instant) -> Vec<(Box<str>, Limit, Vec<IpAddr>)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = super::lock(shard);
            for (user, u) in shard.iter_mut() {
                u.expire(now);
                if !u.addrs.is_empty() {
                    let ips = u.addrs.iter().map(|e| e.ip).collect();
                    out.push((user.clone(), Limit { max: u.max, ttl: u.ttl }, ips));
                }
            }
            shard.retain(|_, u| !u.is_empty());
        }
        out
    }

    /// The addresses the fleet has for each user (this instance's included, or not: those
    /// in use here count once), in place of the last tick's; empty when the fleet's state
    /// is unknown (Redis down). A user the table does not hold gets an entry while its
    /// shard has room.
    pub(crate) fn set_fleet(&self, fleet: &std::collections::HashMap<String, Vec<IpAddr>>) {
        for shard in self.shards.iter() {
            let mut shard = super::lock(shard);
            for u in shard.values_mut() {
                u.others.clear();
            }
            shard.retain(|_, u| !u.is_empty());
        }
        for (user, ips) in fleet {
            let mut shard = self.shard(user);
            if let Some(u) = shard.get_mut(user.as_str()) {
                u.others.clone_from(ips);
            } else if shard.len() < self.per_shard && !ips.is_empty() {
                let u = UserAddrs {
                    ttl: Duration::ZERO,
                    max: 0,
                    addrs: Vec::new(),
                    others: ips.clone(),
                };
                shard.insert(user.as_str().into(), u);
            }
        }
    }

    #[cfg(test)]
    /// Addresses `user` uses at `now`.
    pub(crate) fn in_use(&self, user: &str, now: Instant) -> usize {
        let shard = self.shard(user);
        let ttl = |u: &UserAddrs| u.ttl;
        shard.get(user).map_or(0, |u| {
            u.addrs
                .iter()
                .filter(|e| e.open > 0 || now.saturating_duration_since(e.last) < ttl(u))
                .count()
        })
    }

    #[cfg(test)]
    /// Users in the table (some possibly idle past their TTL, not yet swept).
    pub(crate) fn tracked(&self) -> usize {
        self.shards.iter().map(|s| super::lock(s).len()).sum()
    }
}

/// Removes the users of a shard whose addresses have all been idle for their TTL.
fn sweep(shard: &mut Shard, now: Instant) {
    shard.retain(|_, u| {
        u.expire(now);
        !u.is_empty()
    });
}

#[cfg(test)]
mod tests;
