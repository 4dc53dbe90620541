//! Sticky sessions (`sticky` on `[[route]]`): a table from (route, user, session id) to a
//! seed, so that a user's connections through a route make the same picks (a group's
//! member, the outgoing address) until the session expires.
//!
//! - Shared by every worker (a user's connections land on any of them), in shards each
//!   behind a small lock, found by a keyed hash: only requests on sticky routes take one.
//! - Keyed by the route, the user and the session id together, compared whole: no user
//!   reaches another's session, whatever session id it sends.
//! - A session lasts its ttl from its first use (using it does not prolong it), then the
//!   next use starts a new one with a new seed. Time is `limits::now()`, tokio's clock, so
//!   that tests run it paused.
//! - Bounded: at most `max_sticky_sessions` (a shard holds its share). A full shard
//!   drops its expired sessions first; when none has, a new session gets no seed (its
//!   picks are not sticky) and a warning says so, at most once a minute.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hashbrown::HashTable;

/// Shards of the table: enough that workers seldom meet on one lock.
const SHARDS: usize = 16;

struct Entry {
    hash: u64,
    route: Box<str>,
    user: Box<str>,
    session: Box<str>,
    seed: u64,
    expires: Instant,
}

/// The sticky sessions of the process (kept across a reload that keeps the limit).
pub(crate) struct Table {
    shards: Box<[Mutex<HashTable<Entry>>]>,
    /// Sessions one shard may hold.
    per_shard: usize,
    max: usize,
    /// Keyed per table, so that keys a client picks collide no more often than chance.
    hasher: foldhash::fast::RandomState,
    /// New seeds: a counter put through a keyed mix.
    next: AtomicU64,
    key: u64,
    /// When the table was made, and the minute (since then, plus one) of the last
    /// "full" warning.
    born: Instant,
    warned: AtomicU64,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("max", &self.max).finish_non_exhaustive()
    }
}

impl Table {
    /// A table of at most `max` sessions (rounded up to a multiple of the shards; 0: none,
    /// so no session is sticky).
    pub(crate) fn new(max: usize) -> Table {
        Table::with_shards(max, SHARDS)
    }

    pub(crate) fn with_shards(max: usize, shards: usize) -> Table {
        let shards = shards.max(1);
        let hasher = foldhash::fast::RandomState::default();
        Table {
            shards: (0..shards).map(|_| Mutex::new(HashTable::new())).collect(),
            per_shard: max.div_ceil(shards),
            max,
            key: hasher.hash_one(0x5eed_u64),
            hasher,
            next: AtomicU64::new(1),
            born: crate::limits::now(),
            warned: AtomicU64::new(0),
        }
    }

    /// The limit this table was made with.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The seed of the session (`route`, `user`, `session`) at `now`: the one it was given
    /// when first used, until `ttl` after that; a new one after. None when the table is
    /// full of live sessions (the caller picks as if not sticky).
    pub(crate) fn seed(
        &self,
        route: &str,
        user: &str,
        session: &str,
        ttl: Duration,
        now: Instant,
    ) -> Option<u64> {
        let hash = self.hasher.hash_one((route, user, session));
        let shard = &self.shards[(hash % self.shards.len() as u64) as usize];
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        let same = |e: &Entry| {
            e.hash == hash && *e.route == *route && *e.user == *user && *e.session == *session
        };
        if let Some(e) = map.find_mut(hash, same) {
            if now >= e.expires {
                e.seed = self.fresh();
                e.expires = now + ttl;
            }
            return Some(e.seed);
        }
        if map.len() >= self.per_shard {
            map.retain(|e| now < e.expires);
            if map.len() >= self.per_shard {
                drop(map);
                self.full(now);
                return None;
            }
        }
        let seed = self.fresh();
        let entry = Entry {
            hash,
            route: route.into(),
            user: user.into(),
            session: session.into(),
            seed,
            expires: now + ttl,
        };
        map.insert_unique(hash, entry, |e| e.hash);
        Some(seed)
    }

    /// A seed no one can guess from the ones before (splitmix64 of a keyed counter).
    fn fresh(&self) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut z = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.key;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A new session found the table full: said at most once a minute.
    fn full(&self, now: Instant) {
        let minute = now.saturating_duration_since(self.born).as_secs() / 60 + 1;
        if self.warned.swap(minute, Ordering::Relaxed) != minute {
            tracing::warn!(
                "sticky sessions: the table is full ({} sessions, limits.max_sticky_sessions); \
                 new sessions are not sticky until some expire",
                self.max
            );
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map_or(0, |m| m.len())).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(600);

    #[tokio::test(start_paused = true)]
    async fn same_seed_within_the_ttl_then_a_new_one() {
        let t = Table::new(100);
        let now = crate::limits::now;
        let first = t.seed("r", "alice", "", TTL, now());
        assert!(first.is_some());
        tokio::time::advance(TTL - Duration::from_millis(1)).await;
        assert_eq!(t.seed("r", "alice", "", TTL, now()), first, "within the ttl");
        tokio::time::advance(Duration::from_millis(1)).await;
        let second = t.seed("r", "alice", "", TTL, now());
        assert!(second.is_some() && second != first, "a new session after the ttl");
        // From first use: using it does not prolong it.
        tokio::time::advance(TTL / 2).await;
        assert_eq!(t.seed("r", "alice", "", TTL, now()), second);
        tokio::time::advance(TTL / 2).await;
        assert_ne!(t.seed("r", "alice", "", TTL, now()), second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_ttl_of_its_own() {
        let t = Table::new(100);
        let now = crate::limits::now;
        let short = Duration::from_secs(5);
        let a = t.seed("r", "alice", "s1", short, now());
        let b = t.seed("r", "alice", "s2", TTL, now());
        tokio::time::advance(short).await;
        assert_ne!(t.seed("r", "alice", "s1", short, now()), a, "s1 expired after 5 s");
        assert_eq!(t.seed("r", "alice", "s2", TTL, now()), b, "s2 lives on");
    }

    #[tokio::test(start_paused = true)]
    async fn users_routes_and_sessions_are_apart() {
        let t = Table::new(100);
        let now = crate::limits::now();
        let keys = [
            ("r", "alice", "x"),
            ("r", "bob", "x"),
            ("r", "alice", "y"),
            ("r2", "alice", "x"),
            ("r", "alice", ""),
            // No concatenation makes two keys one.
            ("r", "alicex", ""),
            ("ra", "lice", "x"),
        ];
        let seeds: Vec<_> = keys.iter().map(|(r, u, s)| t.seed(r, u, s, TTL, now)).collect();
        for (i, a) in seeds.iter().enumerate() {
            assert!(a.is_some());
            for b in &seeds[i + 1..] {
                assert_ne!(a, b, "{keys:?}");
            }
        }
        assert_eq!(t.len(), keys.len());
        assert_eq!(t.seed("r", "bob", "x", TTL, now), seeds[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_expired_first_then_not_sticky() {
        let t = Table::with_shards(3, 1);
        let now = crate::limits::now;
        let short = Duration::from_secs(1);
        let a = t.seed("r", "a", "", short, now());
        let b = t.seed("r", "b", "", TTL, now());
        let c = t.seed("r", "c", "", TTL, now());
        assert!(a.is_some() && b.is_some() && c.is_some());
        // Full of live sessions: a new one is not sticky; the old ones stay.
        assert_eq!(t.seed("r", "d", "", TTL, now()), None);
        assert_eq!(t.seed("r", "b", "", TTL, now()), b);
        assert_eq!(t.len(), 3);
        // Once `a` has expired, it makes room.
        tokio::time::advance(short).await;
        assert!(t.seed("r", "d", "", TTL, now()).is_some());
        assert_eq!(t.len(), 3);
        assert_eq!(t.seed("r", "c", "", TTL, now()), c);
        // A limit of 0: nothing is sticky.
        let none = Table::new(0);
        assert_eq!(none.seed("r", "a", "", TTL, now()), None);
    }
}
