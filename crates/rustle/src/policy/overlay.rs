//! Users changed through the admin API (`run/admin`'s `/api/v1/users`): an overlay on top
//! of the users file and `[auth]`'s users, applied whenever the policy is built (at start,
//! on SIGHUP, after each change by the API), so that a reload keeps it. With `[admin]
//! users_state` it is a JSON file, read at start and written after each change (a
//! temporary file, fsync, rename: a crash leaves the old file or the new one whole);
//! without it, changes last until the process ends.
//!
//! Per user, the overlay holds what the API said last: a password hash and groups (a user
//! added), `disabled`, `removed` (a user of the file or the configuration taken away), and
//! per-user bandwidth (`rate_up`, `rate_down`, as `[[auth.user]]` has them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use crate::limits::{Cut, Traffic};
use crate::policy::auth::Users;

/// What the overlay says of one user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    /// The password hash of a user added by the API (argon2id PHC string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) password: Option<String>,
    /// The groups of a user added by the API.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) groups: Vec<String>,
    /// Refused until enabled again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) disabled: bool,
    /// A user of the users file or of `[auth]` taken away by the API.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) removed: bool,
    /// The user's bandwidth, each way (`"10mbit"`), over `limits.user_rate_*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate_up: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate_down: Option<String>,
}

impl Entry {
    /// Whether the entry says nothing (it is then dropped).
    pub(crate) fn is_empty(&self) -> bool {
        *self == Entry::default()
    }

    /// Whether the user is refused: disabled or removed.
    pub(crate) fn refused(&self) -> bool {
        self.disabled || self.removed
    }
}

/// The overlay's contents, as the state file holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct State {
    /// The file's format (1).
    pub(crate) version: u32,
    pub(crate) users: BTreeMap<String, Entry>,
}

/// The format `State` is written in.
const VERSION: u32 = 1;

/// The overlay of a running proxy, shared by the admin thread and reloads.
#[derive(Debug)]
pub struct Overlay {
    /// `[admin] users_state`; None: kept in memory only.
    path: Option<PathBuf>,
    state: Mutex<State>,
}

impl Overlay {
    /// The overlay in `path` (empty when the file does not exist yet), or in memory only.
    pub fn load(path: Option<&Path>) -> Result<Arc<Overlay>, String> {
        let state = match path {
            Some(p) => match std::fs::read(p) {
                Ok(bytes) => {
                    let state: State = serde_json::from_slice(&bytes)
                        .map_err(|e| format!("{}: not a users state file: {e}", p.display()))?;
                    if state.version != VERSION {
                        return Err(format!(
                            "{}: users state version {} (this rustle reads {VERSION})",
                            p.display(),
                            state.version
                        ));
                    }
                    state
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
                Err(e) => return Err(format!("{}: cannot read: {e}", p.display())),
            },
            None => State::default(),
        };
        Ok(Arc::new(Overlay { path: path.map(Path::to_path_buf), state: Mutex::new(state) }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock still holds a whole state: each change is made on a copy.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of the overlay, for building a policy.
    pub(crate) fn snapshot(&self) -> State {
        self.lock().clone()
    }

    /// Changes the overlay with `change` (on a copy) and saves it; nothing changes when
    /// `change` or the save fails.
    pub(crate) fn update<T, E: From<String>>(
        &self,
        change: impl FnOnce(&mut State) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut state = self.lock();
        let mut next = state.clone();
        let out = change(&mut next)?;
        next.version = VERSION;
        next.users.retain(|_, e| !e.is_empty());
        if let Some(path) = &self.path {
            save(path, &next)?;
        }
        *state = next;
        Ok(out)
    }
}

/// Writes `state` to `path` atomically, mode 0600 (it holds password hashes): see
/// `state::file::write_private`. Called with the overlay's lock held: one writer at once.
fn save(path: &Path, state: &State) -> Result<(), String> {
    let mut text = serde_json::to_vec_pretty(state).map_err(|e| e.to_string())?;
    text.push(b'\n');
    crate::state::file::write_private(path, &text)
        .map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// Puts the overlay on top of `users` (the file's and the configuration's): users added
/// put in (replacing one of the same name), refused users taken away, the disabled ones
/// into `disabled` (listed by the API, never authenticated); each added user's problem
/// (a bad hash, a bad name) is returned.
pub(crate) fn apply(state: &State, users: &mut Users, disabled: &mut Users) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, e) in &state.users {
        if let Some(hash) = &e.password {
            users.take(name);
            if let Err(why) = users.add(name, hash, &e.groups) {
                problems.push(format!("users state: user `{name}`: {why}"));
            }
        }
        if e.refused() {
            let user = users.take(name);
            if let (Some(user), false) = (user, e.removed) {
                disabled.put(user);
            }
        }
    }
    problems
}

/// After a new policy's users replace `old`: the open connections of users no longer
/// there are cut (`Removed`, unless already cut), and users there again that were cut
/// for being disabled or removed may connect again (a quota's cut stays).
pub(crate) fn settle(traffic: &Traffic, old: &Users, new: &Users) {
    for name in old.names() {
        if new.get(name).is_none() {
            if let Some(t) = traffic.find(name) {
                if !t.is_cut() {
                    tracing::info!("user `{name}` is gone: its open connections end");
                    crate::limits::cut(&t, Cut::Removed);
                }
            }
        }
    }
    for name in new.names() {
        if let Some(t) = traffic.find(name) {
            if matches!(t.cut_reason(), Some(Cut::Disabled | Cut::Removed)) {
                t.restore();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_is_written_whole_and_read_back() {
        let dir = std::env::temp_dir().join(format!("rustle-overlay-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("users.json");
        let _ = std::fs::remove_file(&path);
        let o = Overlay::load(Some(&path)).expect("no file yet");
        o.update(|s| {
            s.users.insert("alice".into(), Entry { disabled: true, ..Entry::default() });
            s.users.insert("empty".into(), Entry::default());
            Ok::<_, String>(())
        })
        .expect("saved");
        let back = Overlay::load(Some(&path)).expect("read back").snapshot();
        assert_eq!(back.users.len(), 1, "empty entries are dropped");
        assert!(back.users["alice"].disabled);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, b"{\"version\":1,\"users\":{},\"extra\":1}").expect("write");
        assert!(Overlay::load(Some(&path)).is_err(), "unknown fields are refused");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refused_users_are_taken_away_and_added_ones_put_in() {
        let mut users = Users::default();
        users.add("bob", "plain:pw", &[]).expect("bob");
        users.add("carol", "plain:pw", &[]).expect("carol");
        let mut state = State::default();
        state.users.insert("bob".into(), Entry { removed: true, ..Entry::default() });
        state.users.insert(
            "dave".into(),
            Entry {
                password: Some("plain:x".into()),
                groups: vec!["staff".into()],
                ..Entry::default()
            },
        );
        state.users.insert("carol".into(), Entry { disabled: true, ..Entry::default() });
        let mut disabled = Users::default();
        assert!(apply(&state, &mut users, &mut disabled).is_empty());
        assert!(disabled.get("carol").is_some(), "disabled, kept aside");
        assert!(users.get("bob").is_none());
        assert!(users.get("carol").is_none());
        assert!(users.get("dave").is_some_and(|u| u.in_group("staff")));
    }
}
