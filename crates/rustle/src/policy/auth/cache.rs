//! Remembers credentials that passed the slow check, for a while.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::rc::Rc;
use std::time::{Duration, Instant};

use argon2::password_hash::rand_core::{OsRng, RngCore};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::backend::Grant;

/// HMAC-SHA256 of the presented credentials under the cache's own key.
type Tag = [u8; 32];

struct Entry {
    generation: u64,
    verified_at: Instant,
}

/// The verified-credentials cache. Password hashing is slow on purpose, so a successful
/// check is remembered for `ttl`: keyed by HMAC-SHA256, under a random key made here, of the
/// presented user and password, so the cache never holds a password nor a digest that could
/// be attacked offline without the key. At most `max` entries: expired ones go first, then
/// the oldest. One per worker, no locks. Only successes are cached; failures are the
/// `FailureLimiter`'s business.
pub(crate) struct CredentialCache {
    /// HMAC already keyed: each tag clones it rather than hashing the key again.
    mac: Hmac<Sha256>,
    ttl: Duration,
    max: usize,
    entries: HashMap<Tag, Entry>,
}

impl fmt::Debug for CredentialCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialCache")
            .field("entries", &self.entries.len())
            .field("ttl", &self.ttl)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl CredentialCache {
    /// A `ttl` of zero or a `max` of zero turns caching off.
    pub(crate) fn new(ttl: Duration, max: usize) -> Self {
        CredentialCache { mac: keyed_mac(), ttl, max, entries: HashMap::new() }
    }

    /// Whether `user` with `password` was verified within `ttl` against users of this
    /// `generation` (`Users::generation`). A stale entry is dropped.
    pub(crate) fn lookup(&mut self, user: &str, password: &[u8], generation: u64) -> bool {
        self.lookup_at(user, password, generation, Instant::now())
    }

    pub(crate) fn lookup_at(
        &mut self,
        user: &str,
        password: &[u8],
        generation: u64,
        now: Instant,
    ) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let tag = self.tag(user, password);
        match self.entries.get(&tag) {
            Some(entry) if self.is_live(entry, generation, now) => true,
            Some(_) => {
                self.entries.remove(&tag);
                false
            }
            None => false,
        }
    }

    /// Remembers that `user` with `password` passed the check against `generation`.
    pub(crate) fn insert(&mut self, user: &str, password: &[u8], generation: u64) {
        self.insert_at(user, password, generation, Instant::now())
    }

    pub(crate) fn insert_at(&mut self, user: &str, password: &[u8], generation: u64, now: Instant) {
        if self.max == 0 || self.ttl.is_zero() {
            return;
        }
        let tag = self.tag(user, password);
        if !self.entries.contains_key(&tag) && self.entries.len() >= self.max {
            // A linear pass, but an insert follows a check that took milliseconds.
            let (ttl, entries) = (self.ttl, &mut self.entries);
            entries.retain(|_, e| live(e, ttl, generation, now));
            if entries.len() >= self.max {
                let oldest = entries.iter().min_by_key(|(_, e)| e.verified_at).map(|(t, _)| *t);
                if let Some(oldest) = oldest {
                    entries.remove(&oldest);
                }
            }
        }
        self.entries.insert(tag, Entry { generation, verified_at: now });
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn is_live(&self, entry: &Entry, generation: u64, now: Instant) -> bool {
        live(entry, self.ttl, generation, now)
    }

    fn tag(&self, user: &str, password: &[u8]) -> Tag {
        tag(&self.mac, user, password)
    }
}

/// The user's length first, so that no two (user, password) pairs share an input.
fn tag(mac: &Hmac<Sha256>, user: &str, password: &[u8]) -> Tag {
    tag_in(mac, &[], user, password)
}

/// `tag`, after `context` (fixed-size, or led by its length: no two inputs alike).
fn tag_in(mac: &Hmac<Sha256>, context: &[u8], user: &str, password: &[u8]) -> Tag {
    let mut mac = mac.clone();
    mac.update(context);
    mac.update(&(user.len() as u64).to_le_bytes());
    mac.update(user.as_bytes());
    mac.update(password);
    mac.finalize().into_bytes().into()
}

/// What an external backend's answer was given for besides the name and password: the
/// client's address and the listener (a backend may answer each differently), as the
/// fixed-size context of its key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context {
    bytes: [u8; 40],
}

impl Context {
    /// `listener`: the listener's name, else its address, digested to fixed size.
    pub(crate) fn new(client: std::net::IpAddr, listener: &[u8]) -> Context {
        use sha2::Digest as _;
        let mut bytes = [0u8; 40];
        let ip = match client {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        };
        bytes[..16].copy_from_slice(&ip);
        bytes[16..].copy_from_slice(&Sha256::digest(listener)[..24]);
        Context { bytes }
    }
}

fn keyed_mac() -> Hmac<Sha256> {
    // A 64-byte key is HMAC-SHA256's block size: used as it is, never hashed first.
    <Hmac<Sha256> as hmac::digest::KeyInit>::new(&random_key().into())
}

/// An external backend's answer a worker remembers: which backend (its generation), until
/// when, and what it granted (None: refused).
struct Answer {
    generation: u64,
    until: Instant,
    grant: Option<Rc<Grant>>,
}

/// The external backends' answers a worker remembers, accepted and refused, each for its
/// backend's lifetime of that kind; keyed as `CredentialCache` is (HMAC-SHA256 of the user
/// and password under a key of its own), never holding a password. At most `max` entries.
pub(crate) struct Answers {
    mac: Hmac<Sha256>,
    max: usize,
    entries: HashMap<Tag, Answer>,
}

impl fmt::Debug for Answers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Answers").field("entries", &self.entries.len()).finish_non_exhaustive()
    }
}

impl Answers {
    pub(crate) fn new(max: usize) -> Answers {
        Answers { mac: keyed_mac(), max, entries: HashMap::new() }
    }

    /// The answer remembered for `user` and `password` from a backend `valid` accepts
    /// (those of the chain in force), if it has not expired: its generation, its grant
    /// (None: refused) and when it expires. A stale entry is dropped.
    pub(crate) fn lookup(
        &mut self,
        context: &Context,
        user: &str,
        password: &[u8],
        valid: impl Fn(u64) -> bool,
        now: Instant,
    ) -> Option<(u64, Option<Rc<Grant>>, Instant)> {
        if self.entries.is_empty() {
            return None;
        }
        let tag = tag_in(&self.mac, &context.bytes, user, password);
        let entry = self.entries.get(&tag)?;
        if now < entry.until && valid(entry.generation) {
            return Some((entry.generation, entry.grant.clone(), entry.until));
        }
        self.entries.remove(&tag);
        None
    }

    /// Remembers `generation`'s answer for `user` and `password` for `ttl`.
    #[allow(clippy::too_many_arguments)] // the key's three parts, the answer's four
    pub(crate) fn insert(
        &mut self,
        context: &Context,
        user: &str,
        password: &[u8],
        generation: u64,
        ttl: Duration,
        grant: Option<Rc<Grant>>,
        now: Instant,
    ) {
        if self.max == 0 || ttl.is_zero() {
            return;
        }
        let tag = tag_in(&self.mac, &context.bytes, user, password);
        if !self.entries.contains_key(&tag) && self.entries.len() >= self.max {
            self.entries.retain(|_, e| now < e.until);
            if self.entries.len() >= self.max {
                let first = self.entries.iter().min_by_key(|(_, e)| e.until).map(|(t, _)| *t);
                if let Some(first) = first {
                    self.entries.remove(&first);
                }
            }
        }
        self.entries.insert(tag, Answer { generation, until: now + ttl, grant });
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

fn live(entry: &Entry, ttl: Duration, generation: u64, now: Instant) -> bool {
    entry.generation == generation && now.saturating_duration_since(entry.verified_at) < ttl
}

/// 64 random bytes from the OS. Should the OS fail us (it does not on Linux once booted),
/// std's per-process random hash keys, themselves from the OS at start, still make the key
/// unpredictable from outside: better than refusing to start or caching nothing.
fn random_key() -> [u8; 64] {
    let mut key = [0u8; 64];
    if OsRng.try_fill_bytes(&mut key).is_err() {
        let state = RandomState::new();
        for (i, chunk) in key.chunks_mut(8).enumerate() {
            let mut h = state.build_hasher();
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    #[test]
    fn hit_miss_expiry() {
        let t0 = Instant::now();
        let mut cache = CredentialCache::new(TTL, 8);
        assert!(!cache.lookup_at("alice", b"secret", 1, t0));
        cache.insert_at("alice", b"secret", 1, t0);
        assert!(cache.lookup_at("alice", b"secret", 1, t0));
        assert!(cache.lookup_at("alice", b"secret", 1, t0 + TTL - Duration::from_millis(1)));
        assert!(!cache.lookup_at("alice", b"wrong", 1, t0));
        assert!(!cache.lookup_at("bob", b"secret", 1, t0));
        assert!(!cache.lookup_at("alicesecret", b"", 1, t0));
        assert!(!cache.lookup_at("alic", b"esecret", 1, t0));
        assert!(!cache.lookup_at("alice", b"secret", 1, t0 + TTL));
        assert!(cache.is_empty(), "an expired entry is dropped when found");
        assert!(!cache.lookup_at("alice", b"secret", 1, t0));
    }

    #[test]
    fn real_clock() {
        let mut cache = CredentialCache::new(TTL, 8);
        cache.insert("alice", b"secret", 1);
        assert!(cache.lookup("alice", b"secret", 1));
        let mut short = CredentialCache::new(Duration::from_millis(1), 8);
        short.insert("alice", b"secret", 1);
        // The cache reads std's clock: a real wait, which cannot race since a sleep lasts at
        // least what it asks (5 ms past a 1 ms lifetime). The expiry itself is tested on
        // given instants above.
        std::thread::sleep(Duration::from_millis(5));
        assert!(!short.lookup("alice", b"secret", 1));
    }

    #[test]
    fn generation_invalidates() {
        let t0 = Instant::now();
        let mut cache = CredentialCache::new(TTL, 8);
        cache.insert_at("alice", b"secret", 7, t0);
        assert!(!cache.lookup_at("alice", b"secret", 8, t0));
        assert!(!cache.lookup_at("alice", b"secret", 7, t0), "dropped by the stale lookup");
        cache.insert_at("alice", b"secret", 8, t0);
        assert!(cache.lookup_at("alice", b"secret", 8, t0));
    }

    #[test]
    fn bounded() {
        let t0 = Instant::now();
        let mut cache = CredentialCache::new(TTL, 3);
        for (i, user) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            cache.insert_at(user, b"pw", 1, t0 + Duration::from_secs(i as u64));
            assert!(cache.len() <= 3);
        }
        // The oldest went first.
        let now = t0 + Duration::from_secs(5);
        let hits: Vec<bool> =
            ["a", "b", "c", "d", "e"].iter().map(|u| cache.lookup_at(u, b"pw", 1, now)).collect();
        assert_eq!(hits, [false, false, true, true, true]);

        // Expired entries go before live ones, however old.
        let mut cache = CredentialCache::new(Duration::from_secs(10), 3);
        cache.insert_at("old", b"pw", 1, t0);
        cache.insert_at("x", b"pw", 1, t0 + Duration::from_secs(8));
        cache.insert_at("y", b"pw", 1, t0 + Duration::from_secs(9));
        let later = t0 + Duration::from_secs(12);
        cache.insert_at("z", b"pw", 1, later);
        assert_eq!(cache.len(), 3);
        assert!(cache.lookup_at("x", b"pw", 1, later));
        assert!(cache.lookup_at("z", b"pw", 1, later));

        // Re-inserting a present key does not evict another.
        let mut cache = CredentialCache::new(TTL, 2);
        cache.insert_at("a", b"pw", 1, t0);
        cache.insert_at("b", b"pw", 1, t0);
        cache.insert_at("a", b"pw", 1, t0 + Duration::from_secs(1));
        assert!(cache.lookup_at("b", b"pw", 1, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn off() {
        let t0 = Instant::now();
        let mut none = CredentialCache::new(TTL, 0);
        none.insert_at("alice", b"secret", 1, t0);
        assert!(!none.lookup_at("alice", b"secret", 1, t0));
        let mut zero = CredentialCache::new(Duration::ZERO, 8);
        zero.insert_at("alice", b"secret", 1, t0);
        assert!(!zero.lookup_at("alice", b"secret", 1, t0));
    }

    #[test]
    fn answers_expire_and_follow_their_backend() {
        let t0 = Instant::now();
        let mut a = Answers::new(2);
        let grant = Rc::new(Grant { groups: vec!["staff".into()], ..Grant::default() });
        let c = &Context::new([10, 0, 0, 1].into(), b"in");
        a.insert(c, "alice", b"pw", 7, TTL, Some(grant.clone()), t0);
        a.insert(c, "bob", b"bad", 7, Duration::from_secs(5), None, t0);
        let any = |_| true;
        assert_eq!(a.lookup(c, "alice", b"pw", any, t0), Some((7, Some(grant.clone()), t0 + TTL)));
        assert_eq!(a.lookup(c, "alice", b"other", any, t0), None);
        let (other_client, other_listener) =
            (Context::new([10, 0, 0, 2].into(), b"in"), Context::new([10, 0, 0, 1].into(), b"out"));
        assert_eq!(a.lookup(&other_client, "alice", b"pw", any, t0), None, "another client");
        assert_eq!(a.lookup(&other_listener, "alice", b"pw", any, t0), None, "another listener");
        let later = t0 + Duration::from_secs(4);
        let bob = Some((7, None, t0 + Duration::from_secs(5)));
        assert_eq!(a.lookup(c, "bob", b"bad", any, later), bob);
        let expired = t0 + Duration::from_secs(5);
        assert_eq!(a.lookup(c, "bob", b"bad", any, expired), None, "expired");
        assert_eq!(a.lookup(c, "alice", b"pw", |g| g == 8, t0), None, "its backend was rebuilt");
        assert_eq!(a.len(), 0);
        for (i, u) in ["a", "b", "c"].iter().enumerate() {
            a.insert(c, u, b"pw", 1, TTL + Duration::from_secs(i as u64), None, t0);
            assert!(a.len() <= 2);
        }
        assert_eq!(a.lookup(c, "a", b"pw", any, t0), None, "the first to expire went");
        assert!(a.lookup(c, "c", b"pw", any, t0).is_some());
    }

    #[test]
    fn nothing_secret_inside() {
        let mut cache = CredentialCache::new(TTL, 8);
        let password = b"hunter2-very-secret";
        cache.insert("alice", password, 1);
        let debug = format!("{cache:?}");
        assert!(!debug.contains("hunter2") && !debug.contains("alice"), "{debug}");
        // The tag is neither the password nor its plain SHA-256, and depends on the key.
        let tag = cache.tag("alice", password);
        assert!(!tag.windows(password.len()).any(|w| w == password));
        let mut plain_input = Vec::new();
        plain_input.extend_from_slice(&5u64.to_le_bytes());
        plain_input.extend_from_slice(b"alice");
        plain_input.extend_from_slice(password);
        let unkeyed: Tag = <Sha256 as sha2::Digest>::digest(&plain_input).into();
        assert_ne!(tag, unkeyed);
        assert_ne!(tag, CredentialCache::new(TTL, 8).tag("alice", password), "random key");
        assert_eq!(tag, cache.tag("alice", password));
    }
}
