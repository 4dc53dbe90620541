//! One worker's check of a user name and password: the verified-credentials cache first,
//! then the (deliberately slow) hash on the process's hashing threads (`Hasher`), with
//! failed attempts limited per client address and counted before the hash. Per worker, so
//! no lock (the `Hasher` takes one, per hash).

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend::{Ask, Chain, Link, Verdict};
use super::cache::{Answers, Context};
use super::params::ParamError;
use super::{decoy_user, Busy, CredentialCache, FailureLimiter, Hasher, User, Users};
use crate::acl::Params;

/// Verified credentials a worker remembers.
const CRED_CACHE_MAX: usize = 10_000;

/// Client addresses whose failed attempts a worker tracks.
const FAILURE_TRACK_MAX: usize = 10_000;

/// Why credentials were not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// This client failed too often lately: not even checked.
    RateLimited,
    /// An unknown name or a wrong password (not said which).
    Wrong,
    /// The hashing threads' queue is full of other clients' checks: not checked.
    Busy,
    /// An external backend gave no answer: refused (fail closed).
    Unavailable,
}

/// What names and passwords are checked against: the users file (and `[[auth.user]]`),
/// `[auth.params]`, and the external backends in order.
#[derive(Clone, Copy)]
pub(crate) struct Sources<'a> {
    pub(crate) users: &'a Users,
    pub(crate) declared: Option<&'a super::params::Declared>,
    pub(crate) chain: &'a Chain,
}

/// Where credentials came from, for the external backends' calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin<'a> {
    /// The listener's name, if it has one, and its address.
    pub(crate) listener: Option<&'a str>,
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) protocol: &'static str,
}

pub(crate) struct Gate {
    creds: RefCell<CredentialCache>,
    /// The external backends' answers (accepted and refused).
    answers: RefCell<Answers>,
    failures: RefCell<FailureLimiter>,
    /// The `ttl`, `burst` and `per_minute` in force.
    settings: std::cell::Cell<(Duration, u32, u32)>,
    /// The process's hashing threads, shared by the workers.
    hasher: Arc<Hasher>,
}

impl Gate {
    /// `ttl`: how long verified credentials are remembered; `burst` and `per_minute`: the
    /// failed attempts a client address may make; `hasher`: where slow hashes run.
    pub(crate) fn new(ttl: Duration, burst: u32, per_minute: u32, hasher: Arc<Hasher>) -> Gate {
        Gate {
            hasher,
            creds: RefCell::new(CredentialCache::new(ttl, CRED_CACHE_MAX)),
            answers: RefCell::new(Answers::new(CRED_CACHE_MAX)),
            failures: RefCell::new(FailureLimiter::new(burst, per_minute, FAILURE_TRACK_MAX)),
            settings: std::cell::Cell::new((ttl, burst, per_minute)),
        }
    }

    /// New settings (a reload): the cache and the failure counts start afresh only when
    /// their own settings changed.
    pub(crate) fn set_limits(&self, ttl: Duration, burst: u32, per_minute: u32) {
        let (old_ttl, old_burst, old_per_minute) = self.settings.replace((ttl, burst, per_minute));
        if old_ttl != ttl {
            *self.creds.borrow_mut() = CredentialCache::new(ttl, CRED_CACHE_MAX);
        }
        if (old_burst, old_per_minute) != (burst, per_minute) {
            *self.failures.borrow_mut() = FailureLimiter::new(burst, per_minute, FAILURE_TRACK_MAX);
        }
    }

    /// Whether `client` may try a login that needs no hash (a Negotiate token): not when
    /// it has failed too often lately, as for passwords.
    pub(crate) fn may_try(&self, client: IpAddr) -> bool {
        self.failures.borrow_mut().allowed(client, Instant::now())
    }

    /// A login that needed no hash failed (a refused Negotiate token): counted against
    /// `client` as a wrong password is.
    pub(crate) fn failed(&self, client: IpAddr) {
        self.failures.borrow_mut().record_failure(client, Instant::now());
    }

    /// The hashing threads this gate uses (to change their queue's limits on a reload).
    pub(crate) fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    /// Checks the user `name` stands for and `password` against `users`: with
    /// `[auth.params]` (`declared`), the user is taken apart from its parameters first
    /// (`params::Declared::split`), the password checked against the user alone, and the
    /// parameters given back only with a password that passed, so that a wrong password
    /// gets the same answer, after the same work, with or without them; a name with no
    /// user before its parameters is an unknown user. Gives the user (a prefix of `name`)
    /// and what its parameters say.
    /// With external backends (`chain`), a name that is no users-file user (parameters
    /// are for those) is asked of them in order (`verify_chain`).
    pub(crate) async fn authenticate<'u>(
        &self,
        by: Sources<'_>,
        origin: Origin<'_>,
        client: IpAddr,
        name: &'u str,
        password: &[u8],
    ) -> Result<(&'u str, Result<Option<Params>, ParamError>), Refusal> {
        let Sources { users, declared, chain } = by;
        let (user, params) = match declared {
            None => (name, Ok(None)),
            Some(d) => d.split(name, |u| users.get(u).is_some()),
        };
        match chain.is_empty() {
            true => self.verify(users, client, user, password).await?,
            // A remembered acceptance: nothing awaited, nothing boxed.
            false if self.remembered(users, chain, origin, client, user, password) => {}
            // The rest (a hash, calls, a refusal's delay) in a box of its own, so that its
            // state stays out of every connection's future.
            false => {
                let slow = self.verify_chain(users, chain, origin, client, user, password);
                Box::pin(slow).await?
            }
        }
        Ok((user, params))
    }

    /// Whether `user` and `password` were accepted lately, by the users file (the
    /// credential cache) or by an external backend of `chain` (its remembered answer),
    /// and the client is not over its failed attempts: what a login costs most of the
    /// time, the same for both.
    fn remembered(
        &self,
        users: &Users,
        chain: &Chain,
        origin: Origin<'_>,
        client: IpAddr,
        user: &str,
        password: &[u8],
    ) -> bool {
        let now = Instant::now();
        if !self.failures.borrow_mut().allowed(client, now) {
            return false;
        }
        if let Some(u) = users.get(user) {
            // Remembered for the users file only when it is asked first.
            return matches!(chain.links().first(), Some(Link::File))
                && self.creds.borrow_mut().lookup(user, password, u.version());
        }
        let valid = |g| chain.slot_of(g).is_some();
        let context = context(client, origin);
        let Some((generation, Some(grant), until)) =
            self.answers.borrow_mut().lookup(&context, user, password, valid, now)
        else {
            return false;
        };
        let Some(slot) = chain.slot_of(generation) else { return false };
        slot.stats.cached.fetch_add(1, Ordering::Relaxed);
        super::identity::set(user, &grant, slot, until);
        true
    }

    /// Checks `user` and `password` against the backends of `chain`: an external backend's
    /// remembered answer first (no call), then the backends in order until one knows the
    /// user; the users file, at its place, settles the names it has (`verify`). An attempt is counted as failed before the call and given back when it
    /// succeeds, as for a hash. A refusal (a wrong password, a name nobody knows, a
    /// backend that gave no answer) is not answered sooner than `refusal_delay` after
    /// the start, so that backends answering an unknown name faster than a wrong
    /// password do not tell which names exist.
    async fn verify_chain(
        &self,
        users: &Users,
        chain: &Chain,
        origin: Origin<'_>,
        client: IpAddr,
        user: &str,
        password: &[u8],
    ) -> Result<(), Refusal> {
        let start = tokio::time::Instant::now();
        let refused = |why: Refusal| async move {
            tokio::time::sleep_until(start + chain.refusal_delay).await;
            Err(why)
        };
        let now = Instant::now();
        if !self.failures.borrow_mut().allowed(client, now) {
            return Err(Refusal::RateLimited);
        }
        // A name no backend could take (a control character: see `parse_basic`) is asked
        // of none.
        if user.is_empty() || user.chars().any(char::is_control) {
            return refused(Refusal::Wrong).await;
        }
        let context = context(client, origin);
        // A users-file name is the file's to settle, never a remembered backend answer's
        // (the name may have joined the file since).
        let remembered = match users.get(user) {
            Some(_) => None,
            None => {
                let valid = |g| chain.slot_of(g).is_some();
                self.answers.borrow_mut().lookup(&context, user, password, valid, now)
            }
        };
        if let Some((generation, grant, until)) = remembered {
            let Some(slot) = chain.slot_of(generation) else { return Err(Refusal::Wrong) };
            slot.stats.cached.fetch_add(1, Ordering::Relaxed);
            return match grant {
                Some(grant) => {
                    super::identity::set(user, &grant, slot, until);
                    Ok(())
                }
                None => refused(Refusal::Wrong).await,
            };
        }
        // Counted as failed from before the first call (given back on success).
        let mut reserved = false;
        for link in chain.links() {
            let slot = match link {
                // The users file settles the names it has, at its place in the order.
                Link::File if users.get(user).is_some() => {
                    if reserved {
                        // `verify` counts the attempt itself.
                        self.failures.borrow_mut().give_back(client, Instant::now());
                    }
                    return match self.verify(users, client, user, password).await {
                        Err(Refusal::Wrong) => refused(Refusal::Wrong).await,
                        other => other,
                    };
                }
                Link::File => continue,
                Link::External(slot) => slot,
            };
            if !reserved {
                self.failures.borrow_mut().reserve(client, now);
                reserved = true;
            }
            let ask = Ask {
                user: user.to_string(),
                password: password.to_vec(),
                client,
                listener: origin.listener.map_or_else(|| origin.addr.to_string(), str::to_string),
                protocol: origin.protocol,
                target: None,
            };
            let verdict = super::backend::call(slot, ask).await;
            let now = Instant::now();
            let common = &slot.common;
            match verdict {
                Ok(Verdict::Allow(grant)) => {
                    self.failures.borrow_mut().give_back(client, now);
                    let ttl = grant.ttl.map_or(common.cache_ttl, |t| t.min(common.cache_ttl));
                    let grant = Rc::new(grant);
                    let answer = Some(grant.clone());
                    let generation = slot.generation;
                    let mut answers = self.answers.borrow_mut();
                    answers.insert(&context, user, password, generation, ttl, answer, now);
                    super::identity::set(user, &grant, slot, now + ttl);
                    return Ok(());
                }
                Ok(Verdict::Deny) => {
                    let (generation, ttl) = (slot.generation, common.negative_ttl);
                    {
                        let mut answers = self.answers.borrow_mut();
                        answers.insert(&context, user, password, generation, ttl, None, now);
                    }
                    return refused(Refusal::Wrong).await;
                }
                Ok(Verdict::Unknown) => continue,
                Err(e) => {
                    // Not the client's failure: its attempt is given back.
                    self.failures.borrow_mut().give_back(client, now);
                    tracing::debug!(backend = %common.name, "no answer for a login: {e}");
                    return refused(Refusal::Unavailable).await;
                }
            }
        }
        refused(Refusal::Wrong).await
    }

    /// Checks `user` and `password` against `users`. An unknown name costs the same hash
    /// as a known one (the set's most common kind and cost, on the same threads), so that
    /// timing does not tell which names exist. The attempt is counted as failed before
    /// the hash and given back when it succeeds: attempts made at once see each other, so
    /// no more of them are hashed than the client's failure budget allows.
    pub(crate) async fn verify(
        &self,
        users: &Users,
        client: IpAddr,
        user: &str,
        password: &[u8],
    ) -> Result<(), Refusal> {
        let now = Instant::now();
        if !self.failures.borrow_mut().allowed(client, now) {
            return Err(Refusal::RateLimited);
        }
        // Per user: a change to another user (the admin API, a reload) keeps this one's
        // cached check; one to this user drops it.
        let known_user = users.get(user);
        let generation = known_user.map_or(0, User::version);
        if known_user.is_some() && self.creds.borrow_mut().lookup(user, password, generation) {
            return Ok(());
        }
        let (u, known) = match known_user {
            Some(u) => (Some(u.clone()), true),
            None => (users.decoy().or_else(decoy_user), false),
        };
        let Some(u) = u else {
            self.failures.borrow_mut().record_failure(client, now);
            return Err(Refusal::Wrong);
        };
        // `allowed` above and this run with no await between: the token is there.
        let failed_before = self.failures.borrow().has_failed(client);
        self.failures.borrow_mut().reserve(client, now);
        let ok = match u.is_slow() {
            true => match self.hasher.check(client, generation, user, &u, password).await {
                Ok(ok) => ok,
                // Over its own share: the reserved attempt stays counted.
                Err(Busy::Client) => return Err(Refusal::RateLimited),
                // The queue is full. From an address with failures behind it the attempt
                // stays counted, or addresses keeping the queue full (each within its
                // share) would never run out of attempts; one with none gets it back, so
                // that a user meeting a flood keeps its attempts until the flood's
                // addresses have spent theirs and the queue has room again.
                Err(Busy::Queue) => {
                    if !failed_before {
                        self.failures.borrow_mut().give_back(client, Instant::now());
                    }
                    return Err(Refusal::Busy);
                }
            },
            // A constant-time comparison of digests: no thread needed.
            false => u.verify(password),
        };
        if ok && known {
            self.failures.borrow_mut().give_back(client, Instant::now());
            self.creds.borrow_mut().insert(user, password, generation);
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

/// The context a backend's answer is remembered in: the client's address and the
/// listener (its name, else its address).
fn context(client: IpAddr, origin: Origin<'_>) -> Context {
    match origin.listener {
        Some(name) => Context::new(client, name.as_bytes()),
        None => {
            let mut addr = [0u8; 18];
            let ip = match origin.addr.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                IpAddr::V6(v6) => v6.octets(),
            };
            addr[..16].copy_from_slice(&ip);
            addr[16..].copy_from_slice(&origin.addr.port().to_be_bytes());
            Context::new(client, &addr)
        }
    }
}
