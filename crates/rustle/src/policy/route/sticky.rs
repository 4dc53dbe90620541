//! Sticky sessions (`sticky` on `[[route]]`): a table from (route, user, session id) to a
//! seed, so that a user's connections through a route make the same picks (a group's
//! member, the outgoing address) until the session expires.
//!
//! - Shared by every worker (a user's connections land on any of them), in shards each
//!   behind a small lock, found by a keyed hash: only requests on sticky routes take one.
//! - Keyed by the route, the user and the session id together, compared whole: no user
//!   reaches another's session, whatever session id it sends.
//! - A session lasts its ttl from its first use (using it does not prolong it), then the
//!   next use starts a new one with a new seed, in its place. Time is `limits::now()`,
//!   tokio's clock, so that tests run it paused.
//! - Bounded twice. Per user (`max_sticky_sessions_per_user`, across routes): every
//!   session of a user lives in the shard its name hashes to, next to the user's count,
//!   so one lock covers both. A user at its bound drops its own expired sessions; when
//!   none has expired, its new session gets no seed (its picks are not sticky), other
//!   users are untouched, and a warning names the user (each user at most once a
//!   minute, and at most ten users a minute, so that one user cannot hide the others).
//!   In all (`max_sticky_sessions`, each shard its share): a full shard drops its
//!   expired sessions; when none has, a new session gets no seed and a warning says so,
//!   at most once a minute.
//! - A sweep for expired sessions walks the shard under its lock; it runs only when the
//!   earliest expiry recorded (for the shard, for the user) has passed, so a table full
//!   of live sessions answers a new one without a walk.
//! - In a fleet (`[state] backend = "redis"`), a session's first use on this instance
//!   (or its first after it expired) asks the fleet for the session's seed without
//!   waiting for it (`share`): the fleet thread sets the session's key in Redis to this
//!   instance's seed unless another instance set it first, and puts the fleet's seed in
//!   this table in place of its own. No request waits on Redis: the request that started
//!   the session here (and any within the round trip, a millisecond on a LAN) picks with
//!   the local seed; every later one picks what every instance picks. With Redis down,
//!   the local seed stays (the fleet thread logs the loss once).
//! - Memory: a session is one entry of 88 bytes (a table growing by doubling may leave as
//!   many free), with its route name and session id (at most 64 bytes) on the heap;
//!   with a per-user bound, a user's name is held once, shared by its sessions.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

/// Shards of the table: enough that workers seldom meet on one lock.
const SHARDS: usize = 16;

struct Entry {
    /// Of (route, user, session).
    hash: u64,
    /// Of the user alone: the shard, and the user's count.
    user_hash: u64,
    route: Box<str>,
    /// Shared with the user's count.
    user: Arc<str>,
    session: Box<str>,
    seed: u64,
    expires: Instant,
}

/// How many sessions a user has in its shard (kept with a per-user bound only).
struct Count {
    hash: u64,
    user: Arc<str>,
    sessions: usize,
    /// No session of this user expires before this.
    soonest: Option<Instant>,
    /// The minute (`Table::minute`) this user was last warned of at its bound.
    warned: u64,
}

#[derive(Default)]
struct Shard {
    sessions: HashTable<Entry>,
    users: HashTable<Count>,
    /// No session here expires before this (None: none is here).
    soonest: Option<Instant>,
}

fn earlier(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

impl Shard {
    /// Drops every expired session (a full shard), the users' counts with them.
    fn sweep(&mut self, now: Instant) {
        let Shard { sessions, users, soonest } = self;
        *soonest = None;
        sessions.retain(|e| {
            if now < e.expires {
                *soonest = earlier(*soonest, e.expires);
                return true;
            }
            if let Some(c) = users.find_mut(e.user_hash, |c| *c.user == *e.user) {
                c.sessions = c.sessions.saturating_sub(1);
            }
            false
        });
        // A user's `soonest` stays a bound from below: at worst a sweep of its own finds
        // nothing and sets it right.
        users.retain(|c| c.sessions > 0);
    }

    /// Drops the expired sessions of `user` (at its bound): its count and earliest expiry
    /// are exact after. Gives the sessions it has left.
    fn sweep_user(&mut self, user: &str, user_hash: u64, now: Instant) -> usize {
        let Shard { sessions, users, .. } = self;
        let (mut dropped, mut soonest) = (0, None);
        sessions.retain(|e| {
            if e.user_hash != user_hash || *e.user != *user {
                return true;
            }
            if now < e.expires {
                soonest = earlier(soonest, e.expires);
                return true;
            }
            dropped += 1;
            false
        });
        // The shard's `soonest` stays a bound from below.
        let Some(c) = users.find_mut(user_hash, |c| *c.user == *user) else { return 0 };
        c.sessions = c.sessions.saturating_sub(dropped);
        c.soonest = soonest;
        c.sessions
    }
}

/// The sticky sessions of the process (kept across a reload that keeps the limits).
pub(crate) struct Table {
    shards: Box<[Mutex<Shard>]>,
    /// Sessions one shard may hold.
    per_shard: usize,
    max: usize,
    /// Sessions one user may hold across routes (0: no bound, and no counts kept).
    per_user: usize,
    /// Keyed per table, so that keys a client picks collide no more often than chance.
    hasher: foldhash::fast::RandomState,
    /// New seeds: a counter put through a keyed mix.
    next: AtomicU64,
    key: u64,
    /// When the table was made, and the minute (`minute`) of the last warning that a
    /// shard was full.
    born: Instant,
    warned: AtomicU64,
    /// The minute of the last warnings that users were at their bound, and how many
    /// that minute had (each user at most once a minute, at most `USER_WARNINGS` in all).
    warned_users: Mutex<(u64, u32)>,
    /// Warnings of users at their bound said so far.
    #[cfg(test)]
    user_warnings: AtomicU64,
}

/// Users named in warnings of their bound, in one minute.
const USER_WARNINGS: u32 = 10;

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("max", &self.max)
            .field("per_user", &self.per_user)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// A table of at most `max` sessions (0: none, so no session is sticky), at most
    /// `per_user` of them one user's (0: no bound but `max`).
    pub(crate) fn new(max: usize, per_user: usize) -> Table {
        // A user's sessions share one shard: few enough shards that one holds a user's
        // bound, when the table can.
        let shards = match per_user {
            0 => SHARDS,
            n => (max / n).clamp(1, SHARDS),
        };
        Table::with_shards(max, per_user, shards)
    }

    pub(crate) fn with_shards(max: usize, per_user: usize, shards: usize) -> Table {
        let shards = shards.max(1);
        let hasher = foldhash::fast::RandomState::default();
        Table {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: max.div_ceil(shards),
            max,
            per_user,
            key: hasher.hash_one(0x5eed_u64),
            hasher,
            next: AtomicU64::new(1),
            born: crate::limits::now(),
            warned: AtomicU64::new(0),
            warned_users: Mutex::new((0, 0)),
            #[cfg(test)]
            user_warnings: AtomicU64::new(0),
        }
    }

    /// The limits this table was made with: in all, and per user.
    pub(crate) fn limits(&self) -> (usize, usize) {
        (self.max, self.per_user)
    }

    /// The seed of the session (`route`, `user`, `session`) at `now`: the one it was given
    /// when first used, until `ttl` after that; a new one after. None when the user is at
    /// its bound, or the shard full, with live sessions (the caller picks as if not
    /// sticky).
    #[cfg(test)]
    pub(crate) fn seed(
        &self,
        route: &str,
        user: &str,
        session: &str,
        ttl: Duration,
        now: Instant,
    ) -> Option<u64> {
        self.seed_fresh(route, user, session, ttl, now).map(|(seed, _)| seed)
    }

    /// `seed`, and whether the seed was made by this call (a session's first use here, or
    /// its first since it expired): only then does the fleet hear of it (`share`).
    pub(crate) fn seed_fresh(
        &self,
        route: &str,
        user: &str,
        session: &str,
        ttl: Duration,
        now: Instant,
    ) -> Option<(u64, bool)> {
        let hash = self.hasher.hash_one((route, user, session));
        // Without a per-user bound, the whole key spreads the sessions over the shards.
        let bounded = self.per_user > 0;
        let user_hash = if bounded { self.hasher.hash_one(user) } else { hash };
        let shard = &self.shards[(user_hash % self.shards.len() as u64) as usize];
        let mut guard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *guard;
        let same = |e: &Entry| {
            e.hash == hash && *e.route == *route && *e.user == *user && *e.session == *session
        };
        if let Some(e) = s.sessions.find_mut(hash, same) {
            let fresh = now >= e.expires;
            if fresh {
                // Replaced in its place: the counts stand, and the earliest expiries
                // stay bounds from below.
                e.seed = self.fresh();
                e.expires = now + ttl;
            }
            return Some((e.seed, fresh));
        }
        if bounded {
            if let Some(c) = s.users.find(user_hash, |c| *c.user == *user) {
                let mut has = c.sessions;
                if has >= self.per_user && c.soonest.is_some_and(|t| now >= t) {
                    has = s.sweep_user(user, user_hash, now);
                }
                if has >= self.per_user {
                    // Said of each user at most once a minute.
                    let minute = self.minute(now);
                    let due = s
                        .users
                        .find_mut(user_hash, |c| *c.user == *user)
                        .is_some_and(|c| std::mem::replace(&mut c.warned, minute) != minute);
                    drop(guard);
                    if due {
                        self.user_full(user, minute);
                    }
                    return None;
                }
            }
        }
        if s.sessions.len() >= self.per_shard {
            if s.soonest.is_some_and(|t| now >= t) {
                s.sweep(now);
            }
            if s.sessions.len() >= self.per_shard {
                drop(guard);
                self.full(now);
                return None;
            }
        }
        let seed = self.fresh();
        let expires = now + ttl;
        let user: Arc<str> = match bounded {
            false => user.into(),
            true => match s.users.find_mut(user_hash, |c| *c.user == *user) {
                Some(c) => {
                    c.sessions += 1;
                    c.soonest = earlier(c.soonest, expires);
                    c.user.clone()
                }
                None => {
                    let name: Arc<str> = user.into();
                    let c = Count {
                        hash: user_hash,
                        user: name.clone(),
                        sessions: 1,
                        soonest: Some(expires),
                        warned: 0,
                    };
                    s.users.insert_unique(user_hash, c, |c| c.hash);
                    name
                }
            },
        };
        s.soonest = earlier(s.soonest, expires);
        let entry = Entry {
            hash,
            user_hash,
            route: route.into(),
            user,
            session: session.into(),
            seed,
            expires,
        };
        s.sessions.insert_unique(hash, entry, |e| e.hash);
        Some((seed, true))
    }

    /// Puts `fleet`, the seed the fleet has for the session, in place of `local`, the one
    /// this table made for it, unless the session started again since.
    fn adopt(&self, route: &str, user: &str, session: &str, local: u64, fleet: u64) {
        let hash = self.hasher.hash_one((route, user, session));
        let user_hash = if self.per_user > 0 { self.hasher.hash_one(user) } else { hash };
        let shard = &self.shards[(user_hash % self.shards.len() as u64) as usize];
        let mut s = shard.lock().unwrap_or_else(|p| p.into_inner());
        let same = |e: &Entry| {
            e.hash == hash && *e.route == *route && *e.user == *user && *e.session == *session
        };
        if let Some(e) = s.sessions.find_mut(hash, same) {
            if e.seed == local {
                e.seed = fleet;
            }
        }
    }

    /// A seed no one can guess from the ones before (splitmix64 of a keyed counter).
    fn fresh(&self) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut z = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.key;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The minute of `now` since the table was made, plus one (0: never).
    fn minute(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.born).as_secs() / 60 + 1
    }

    /// A new session found its shard full (a limit of 0, meaning nothing sticky, is no
    /// news).
    fn full(&self, now: Instant) {
        let minute = self.minute(now);
        if self.max > 0 && self.warned.swap(minute, Ordering::Relaxed) != minute {
            tracing::warn!(
                "sticky sessions: the table is full ({} sessions, limits.max_sticky_sessions); \
                 new sessions are not sticky until some expire",
                self.max
            );
        }
    }

    /// A new session of `user` found it at its bound, in `minute`, and the user was not
    /// warned of yet that minute: said unless `USER_WARNINGS` users were already.
    fn user_full(&self, user: &str, minute: u64) {
        let mut last = self.warned_users.lock().unwrap_or_else(|p| p.into_inner());
        if last.0 != minute {
            *last = (minute, 0);
        }
        last.1 += 1;
        let n = last.1;
        drop(last);
        if n <= USER_WARNINGS {
            tracing::warn!("{}", self.user_full_message(user));
            #[cfg(test)]
            self.user_warnings.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn user_full_message(&self, user: &str) -> String {
        // The user passed authentication, so its name is one of the users' (at most 64
        // bytes, no control character); escaped all the same.
        format!(
            "sticky sessions: user `{}` has {} sessions (limits.max_sticky_sessions_per_user); \
             its new sessions are not sticky until some expire",
            user.escape_debug(),
            self.per_user
        )
    }

    /// Sessions held, expired or not.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map_or(0, |s| s.sessions.len())).sum()
    }

    /// The count kept for `user`, after checking it against the sessions held, and every
    /// other count and earliest expiry likewise.
    #[cfg(test)]
    fn count(&self, user: &str) -> usize {
        let mut found = 0;
        for shard in self.shards.iter() {
            let s = shard.lock().expect("no test panics holding it");
            if let Some(held) = s.sessions.iter().map(|e| e.expires).min() {
                assert!(s.soonest.is_some_and(|t| t <= held), "the shard's soonest: from below");
            }
            if self.per_user == 0 {
                assert_eq!(s.users.len(), 0);
            }
            for c in s.users.iter() {
                let mine: Vec<_> = s.sessions.iter().filter(|e| *e.user == *c.user).collect();
                assert_eq!(c.sessions, mine.len(), "the count of {}", c.user);
                assert!(c.sessions > 0 && c.sessions <= self.per_user);
                let held = mine.iter().map(|e| e.expires).min().expect("counted: held");
                assert!(c.soonest.is_some_and(|t| t <= held), "{}'s soonest: from below", c.user);
                if *c.user == *user {
                    found = c.sessions;
                }
            }
            for e in s.sessions.iter() {
                assert!(self.per_user == 0 || s.users.iter().any(|c| *c.user == *e.user));
            }
        }
        found
    }
}

/// Tells the fleet, when there is one, of a session this instance started with `seed`
/// (`Table::seed_fresh`), and takes the fleet's seed for it when another instance started
/// it first. Never waits: the fleet thread runs the round trip.
pub(crate) fn share(
    table: &Arc<Table>,
    route: &str,
    user: &str,
    session: &str,
    seed: u64,
    ttl: Duration,
) {
    let Some(fleet) = crate::state::fleet::current() else { return };
    let table = table.clone();
    let (route, user, session) = (route.to_string(), user.to_string(), session.to_string());
    // The answer comes back through the table; a stopped fleet leaves the local seed.
    fleet.spawn(move |f| async move {
        // Each part escaped, so that no two sessions meet on one key.
        let key = format!("{}:{}:{}", esc(&route), esc(&user), esc(&session));
        match f.sticky_get_or_set(&key, &seed.to_string(), ttl).await {
            Ok(value) => match value.parse::<u64>() {
                Ok(theirs) if theirs != seed => table.adopt(&route, &user, &session, seed, theirs),
                Ok(_) => {}
                Err(_) => tracing::debug!("state: sticky session {key}: not a seed in Redis"),
            },
            Err(e) => tracing::debug!("state: sticky session {key} kept local: {e}"),
        }
    });
}

fn esc(s: &str) -> String {
    s.replace('%', "%25").replace(':', "%3A")
}

#[cfg(test)]
mod tests;
