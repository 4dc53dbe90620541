//! The users an external backend accepted, as this worker knows them: what the backend
//! granted (groups for rules and routes, RADIUS accounting). One table per worker thread
//! (a worker is a thread with its own runtime), filled by the worker's `Gate` when it
//! accepts a user through a backend (called or cached), read where a users-file user's
//! `User` is read; a user of the users file never comes here.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use super::backend::{Grant, Slot};

/// Users a worker keeps the grants of, at most (as many as its credential cache).
const MAX: usize = 10_000;

/// What a backend granted a user, and which backend.
#[derive(Clone)]
pub(crate) struct Identity {
    pub(crate) grant: Rc<Grant>,
    pub(crate) slot: Arc<Slot>,
}

thread_local! {
    static TABLE: RefCell<HashMap<Box<str>, Identity>> = RefCell::new(HashMap::new());
}

/// Records that `slot` granted `grant` to `user` (the latest answer wins).
pub(crate) fn set(user: &str, grant: &Rc<Grant>, slot: &Arc<Slot>) {
    TABLE.with_borrow_mut(|t| {
        if let Some(i) = t.get(user) {
            if Rc::ptr_eq(&i.grant, grant) {
                return;
            }
        } else if t.len() >= MAX {
            // Bounded: the oldest answers are in the caches' hands anyway; start afresh.
            t.clear();
        }
        t.insert(user.into(), Identity { grant: grant.clone(), slot: slot.clone() });
    })
}

/// What a backend granted `user` on this worker, if one did.
pub(crate) fn get(user: &str) -> Option<Identity> {
    TABLE.with_borrow(|t| t.get(user).cloned())
}

/// The groups a backend gave `user`, empty when none did.
pub(crate) fn groups(user: &str) -> Rc<[String]> {
    TABLE.with_borrow(|t| match t.get(user) {
        Some(i) => i.grant.groups.as_slice().into(),
        None => Rc::from(Vec::new()),
    })
}
