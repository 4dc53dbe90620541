//! The users an external backend accepted, as this worker knows them: what the backend
//! granted (groups for rules and routes, an outgoing address, a bandwidth). One table per
//! worker thread (a worker is a thread with its own runtime), filled by the worker's `Gate`
//! when it accepts a user through a backend (called or remembered), read where a
//! users-file user's `User` is read; a user of the users file never comes here. An entry
//! holds as long as the answer it came from and only while its backend is in force.
//!
//! The login itself (`login`) is handed to the connection that made it: the connection's
//! guard takes it (`take_login`) right after the login, with no await between, so that a
//! connection's limit and accounting come from its own login, never from another's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::backend::{Chain, Grant, Slot};

/// Users a worker keeps the grants of, at most (as many as its credential cache).
const MAX: usize = 10_000;

/// What a backend granted a user, which backend, and until when.
#[derive(Clone)]
pub(crate) struct Identity {
    pub(crate) user: Rc<str>,
    pub(crate) grant: Rc<Grant>,
    pub(crate) slot: Arc<Slot>,
    until: Instant,
}

impl Identity {
    fn live(&self, chain: &Chain, now: Instant) -> bool {
        now < self.until && chain.slot_of(self.slot.generation).is_some()
    }
}

/// Whether any backend ever granted a bandwidth: until one does, a connection's throttle
/// looks no user up (`any_bandwidth`).
static BANDWIDTH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether any backend ever granted an outgoing address: until one does, a request looks
/// no user up for one (`any_egress`).
static EGRESS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    static TABLE: RefCell<HashMap<Rc<str>, Identity>> = RefCell::new(HashMap::new());
    static LOGIN: RefCell<Option<Identity>> = const { RefCell::new(None) };
}

/// Records that `slot` granted `grant` to `user` until `until` (the latest answer wins),
/// and makes it the login the next `take_login` gives.
pub(crate) fn set(user: &str, grant: &Rc<Grant>, slot: &Arc<Slot>, until: Instant) {
    if grant.bandwidth.is_some() && !BANDWIDTH.load(std::sync::atomic::Ordering::Relaxed) {
        BANDWIDTH.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if grant.egress.is_some() && !EGRESS.load(std::sync::atomic::Ordering::Relaxed) {
        EGRESS.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let identity = TABLE.with_borrow_mut(|t| {
        if let Some(i) = t.get_mut(user) {
            if Rc::ptr_eq(&i.grant, grant) && Arc::ptr_eq(&i.slot, slot) {
                i.until = i.until.max(until);
                return i.clone();
            }
        } else if t.len() >= MAX {
            let now = Instant::now();
            t.retain(|_, i| now < i.until);
            if t.len() >= MAX {
                // Every entry live: the one closest to its end goes.
                let first = t.iter().min_by_key(|(_, i)| i.until).map(|(u, _)| u.clone());
                if let Some(first) = first {
                    t.remove(&first);
                }
            }
        }
        let user: Rc<str> = Rc::from(user);
        let identity =
            Identity { user: user.clone(), grant: grant.clone(), slot: slot.clone(), until };
        t.insert(user, identity.clone());
        identity
    });
    LOGIN.with_borrow_mut(|l| *l = Some(identity));
}

/// Forgets the login not taken (a login about to be checked).
pub(crate) fn clear_login() {
    LOGIN.with_borrow_mut(|l| *l = None);
}

/// The login just made through a backend, if it was `user`'s.
pub(crate) fn take_login(user: &str) -> Option<Identity> {
    LOGIN.with_borrow_mut(|l| l.take()).filter(|i| &*i.user == user)
}

/// What a backend of `chain` granted `user` on this worker, if one did and it holds.
pub(crate) fn get(user: &str, chain: &Chain) -> Option<Identity> {
    let now = Instant::now();
    TABLE.with_borrow(|t| t.get(user).filter(|i| i.live(chain, now)).cloned())
}

/// Whether any backend ever granted any user a bandwidth.
pub(crate) fn any_bandwidth() -> bool {
    BANDWIDTH.load(std::sync::atomic::Ordering::Relaxed)
}

/// The bandwidth a backend of `chain` granted `user`, if one did and it holds (nothing
/// cloned: read for every connection's throttle once any grant has one).
pub(crate) fn bandwidth(user: &str, chain: &Chain) -> Option<u64> {
    let now = Instant::now();
    TABLE
        .with_borrow(|t| t.get(user).filter(|i| i.live(chain, now)).and_then(|i| i.grant.bandwidth))
}

/// The outgoing address a backend of `chain` granted `user`, if one did and it holds
/// (nothing looked up until some grant has one; nothing cloned).
pub(crate) fn egress(user: &str, chain: &Chain) -> Option<std::net::IpAddr> {
    if !EGRESS.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let now = Instant::now();
    TABLE.with_borrow(|t| t.get(user).filter(|i| i.live(chain, now)).and_then(|i| i.grant.egress))
}

/// The groups a backend of `chain` gave `user`, empty when none did or it no longer holds.
pub(crate) fn groups(user: &str, chain: &Chain) -> Rc<[String]> {
    match get(user, chain) {
        Some(i) => i.grant.groups.as_slice().into(),
        None => Rc::from(Vec::new()),
    }
}
