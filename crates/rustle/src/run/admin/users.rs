//! The users API, `/api/v1/users`: list, show, add, disable, enable, remove users and set
//! their bandwidth while the proxy runs. Each change goes into the overlay
//! (`policy::overlay`, saved to `[admin] users_state` when set), then a policy with it is
//! put in force (`UsersState::republish`), and a user disabled or removed has its open
//! connections cut (`limits::cut`). Hashing a password, saving the overlay and building
//! the policy run on the blocking pool, so that the admin thread goes on answering
//! `/metrics` meanwhile.
//!
//! Routes are a table (`ROUTES`) of a method and a path pattern each: another endpoint is
//! one more line and one more `Action`.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::{Reply, Request, View};
use crate::limits::{cut, Cut, Traffic};
use crate::policy::overlay::{Entry, Overlay};
use crate::policy::Policy;

/// Puts a policy with the overlay as it is now in force (blocking: it builds one).
pub(crate) type Republish = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What the users API changes, handed over by `server`.
pub(crate) struct UsersState {
    /// Each user's counters and cut flag.
    pub(crate) traffic: Arc<Traffic>,
    pub(crate) overlay: Arc<Overlay>,
    pub(crate) republish: Republish,
    /// The quotas and their usage (reset, top-up).
    pub(crate) quotas: Arc<crate::state::Keeper>,
}

/// What a route does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    List,
    Add,
    Get,
    Remove,
    Disable,
    Enable,
    SetLimits,
    Reset,
    TopUp,
}

/// A path segment of a route: a literal, or the user's name.
#[derive(Clone, Copy)]
enum Seg {
    Lit(&'static str),
    Name,
}

/// Every route: method, path below `/api/v1/`, action.
const ROUTES: &[(&str, &[Seg], Action)] = &[
    ("GET", &[Seg::Lit("users")], Action::List),
    ("POST", &[Seg::Lit("users")], Action::Add),
    ("GET", &[Seg::Lit("users"), Seg::Name], Action::Get),
    ("DELETE", &[Seg::Lit("users"), Seg::Name], Action::Remove),
    ("POST", &[Seg::Lit("users"), Seg::Name, Seg::Lit("disable")], Action::Disable),
    ("POST", &[Seg::Lit("users"), Seg::Name, Seg::Lit("enable")], Action::Enable),
    ("PUT", &[Seg::Lit("users"), Seg::Name, Seg::Lit("limits")], Action::SetLimits),
    ("POST", &[Seg::Lit("users"), Seg::Name, Seg::Lit("reset")], Action::Reset),
    ("POST", &[Seg::Lit("users"), Seg::Name, Seg::Lit("top-up")], Action::TopUp),
];

/// Whether `segs` fit `pattern`.
fn fits(pattern: &[Seg], segs: &[&str]) -> bool {
    pattern.len() == segs.len()
        && pattern.iter().zip(segs).all(|(p, s)| match p {
            Seg::Lit(l) => l == s,
            Seg::Name => true,
        })
}

/// The answer to an authorized request under `/api`.
pub(super) async fn answer(
    users: &UsersState,
    view: &watch::Receiver<Arc<View>>,
    req: &Request,
    peer: SocketAddr,
) -> Reply {
    let Some(rest) = req.path.strip_prefix("/api/v1/") else {
        return Reply::error(404, "not found: the users API is under /api/v1/users");
    };
    let segs: Vec<&str> = rest.split('/').collect();
    let mut allowed = Vec::new();
    let mut found = None;
    for (method, pattern, action) in ROUTES.iter().filter(|(_, p, _)| fits(p, &segs)) {
        allowed.push(*method);
        if *method == req.method {
            let name = pattern.iter().position(|p| matches!(p, Seg::Name)).map(|i| segs[i]);
            found = Some((*action, name));
        }
    }
    let Some((action, name)) = found else {
        if allowed.is_empty() {
            return Reply::error(404, &format!("not found: {}", req.path));
        }
        let mut r = Reply::error(405, &format!("method not allowed: use {}", allowed.join(", ")));
        r.headers = "Allow: GET, POST, PUT, DELETE\r\n";
        return r;
    };
    let name = match name.map(user_name).transpose() {
        Ok(name) => name,
        Err(why) => return Reply::error(400, &why),
    };
    let policy = view.borrow().policy.clone();
    let reply = match (action, name) {
        (Action::List, _) => {
            let mut names: Vec<&str> =
                policy.users.names().chain(policy.disabled.names()).collect();
            names.sort_unstable();
            names.dedup();
            let overlay = users.overlay.snapshot();
            let list: Vec<Value> =
                names.iter().map(|n| describe(users, &policy, &overlay, n)).collect();
            Ok(Reply::json(200, &json!({ "users": list })))
        }
        (Action::Get, Some(name)) => match exists(&policy, &name) {
            true => {
                let overlay = users.overlay.snapshot();
                Ok(Reply::json(200, &describe(users, &policy, &overlay, &name)))
            }
            false => Err(not_found(&name)),
        },
        (Action::Add, _) => add(users, &policy, &req.body).await,
        (Action::Remove, Some(name)) => {
            change(users, &policy, name, Some(Cut::Removed), |e| {
                *e = Entry { removed: true, ..Entry::default() };
            })
            .await
        }
        // Any name may be disabled: a certificate's user need not be in the users file.
        (Action::Disable, Some(name)) => {
            change_name(users, name, Some(Cut::Disabled), |e| e.disabled = true).await
        }
        // A certificate's name disabled: no users file brings it back (`overlay::settle`),
        // so its cut ends here.
        (Action::Enable, Some(name)) if policy.refused_as(&name).is_some() => {
            let traffic = users.traffic.find(&name);
            let reply = change_name(users, name, None, |e| e.disabled = false).await;
            if let (Ok(_), Some(t)) = (&reply, traffic) {
                if matches!(t.cut_reason(), Some(Cut::Disabled)) {
                    t.restore();
                }
            }
            reply
        }
        (Action::Enable, Some(name)) => {
            change(users, &policy, name, None, |e| e.disabled = false).await
        }
        (Action::SetLimits, Some(name)) => set_limits(users, &policy, name, &req.body).await,
        (Action::Reset, Some(name)) => reset(users, &policy, name, &req.body),
        (Action::TopUp, Some(name)) => top_up(users, &policy, name, &req.body),
        // Every route of these actions has a name segment.
        (
            Action::Get
            | Action::Remove
            | Action::Disable
            | Action::Enable
            | Action::SetLimits
            | Action::Reset
            | Action::TopUp,
            None,
        ) => Err(Reply::error(404, "no user named")),
    };
    let reply = reply.unwrap_or_else(|r| r);
    if reply.status < 300 && req.method != "GET" {
        tracing::info!("admin: {peer}: {} {}: {}", req.method, req.path, reply.status);
    }
    reply
}

/// A user name from a path segment: percent-decoded, then checked as a users file's name
/// is (and no '/', which a path segment cannot hold undecoded either).
fn user_name(seg: &str) -> Result<String, String> {
    let bytes = seg.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) else {
                return Err("malformed percent-encoding in the user name".into());
            };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let name = String::from_utf8(out).map_err(|_| "the user name is not UTF-8".to_string())?;
    check_user_name(&name)?;
    Ok(name)
}

/// A user name the API takes (added, or in a path): a users-file name without '/', so
/// that every user added can be managed by the per-user routes.
fn check_user_name(name: &str) -> Result<(), String> {
    if name.contains('/') {
        return Err("user name contains '/'".into());
    }
    crate::policy::auth::check_name("user", name)
}

fn not_found(name: &str) -> Reply {
    Reply::error(404, &format!("no user `{name}`"))
}

/// Whether `name` is a user, enabled or disabled.
fn exists(policy: &Policy, name: &str) -> bool {
    policy.users.get(name).is_some() || policy.disabled.get(name).is_some()
}

/// What the API shows of a user.
fn describe(
    users: &UsersState,
    policy: &Policy,
    overlay: &crate::policy::overlay::State,
    name: &str,
) -> Value {
    let entry = overlay.users.get(name);
    let disabled = policy.users.get(name).is_none();
    let user = policy.users.get(name).or_else(|| policy.disabled.get(name));
    let groups = user.map(|u| u.groups.clone()).unwrap_or_default();
    let source = match entry.is_some_and(|e| e.password.is_some()) {
        true => "api",
        false => "file",
    };
    let (up, down) = policy.user_rate(name);
    let traffic = users.traffic.find(name);
    let (sent, received) = traffic.as_ref().map_or((0, 0), |t| t.get());
    let open = traffic.as_ref().map_or(0, |t| t.open.load(std::sync::atomic::Ordering::Relaxed));
    json!({
        "name": name,
        "groups": groups,
        "disabled": disabled,
        "source": source,
        "limits": {
            "rate_up": entry.and_then(|e| e.rate_up.clone()),
            "rate_down": entry.and_then(|e| e.rate_down.clone()),
            "rate_up_bytes": up,
            "rate_down_bytes": down,
        },
        "traffic": { "up": sent, "down": received },
        "connections": open,
        "quotas": quotas(users, name),
    })
}

/// Each quota of the user: used, limit (with top-ups), when it resets, used up.
fn quotas(users: &UsersState, name: &str) -> Vec<Value> {
    let usage = users.quotas.usage(name);
    usage
        .into_iter()
        .map(|(quota, used, limit, resets_at)| {
            json!({
                "quota": quota,
                "used": used,
                "limit": limit,
                "resets_at": resets_at,
                "exceeded": used >= limit,
            })
        })
        .collect()
}

/// `POST .../reset`'s body (optional: every quota).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    quota: Option<String>,
}

/// `POST .../top-up`'s body: bytes as a number or a size ("1MB", "5 GiB").
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopUpBody {
    quota: String,
    bytes: Value,
}

/// The quota a reset or top-up names, checked: configured, and one of the user's.
fn known_quota(users: &UsersState, name: &str, quota: &str) -> Result<(), Reply> {
    if !users.quotas.has_quota(quota) {
        return Err(Reply::error(404, &format!("no quota `{quota}`")));
    }
    match users.quotas.usage(name).iter().any(|(q, ..)| q == quota) {
        true => Ok(()),
        false => Err(Reply::error(404, &format!("quota `{quota}` is not one of `{name}`'s"))),
    }
}

/// What a reset or a top-up answers: the user's quotas as they are now, and whether the
/// change goes to the fleet's Redis too (made by the quota thread at once, or as soon as
/// Redis answers).
fn quota_reply(users: &UsersState, name: &str) -> Reply {
    Reply::json(
        200,
        &json!({ "name": name, "quotas": quotas(users, name), "fleet": users.quotas.shared() }),
    )
}

/// Forgets the user's usage of one quota or all in the current period; a user back
/// within its quotas is let in at once.
fn reset(users: &UsersState, policy: &Policy, name: String, body: &[u8]) -> Result<Reply, Reply> {
    if !exists(policy, &name) {
        return Err(not_found(&name));
    }
    let body: ResetBody = match body.iter().all(u8::is_ascii_whitespace) {
        true => ResetBody::default(),
        false => parse(body, "quota")?,
    };
    if let Some(q) = &body.quota {
        known_quota(users, &name, q)?;
    }
    users.quotas.reset(&name, body.quota.as_deref());
    Ok(quota_reply(users, &name))
}

/// Allows the user more bytes of one quota in the current period; a user back within its
/// quotas is let in at once.
fn top_up(users: &UsersState, policy: &Policy, name: String, body: &[u8]) -> Result<Reply, Reply> {
    if !exists(policy, &name) {
        return Err(not_found(&name));
    }
    let body: TopUpBody = parse(body, "quota, bytes")?;
    let bytes = match &body.bytes {
        Value::Number(n) => n.as_u64().ok_or("a whole number of bytes".to_string()),
        Value::String(s) => crate::config::parse_size(s),
        _ => Err("a number or a size such as \"1MB\"".to_string()),
    }
    .map_err(|e| Reply::error(400, &format!("bytes: {e}")))?;
    if bytes == 0 {
        return Err(Reply::error(400, "bytes: 0"));
    }
    known_quota(users, &name, &body.quota)?;
    users.quotas.top_up(&name, &body.quota, bytes);
    Ok(quota_reply(users, &name))
}

/// `POST /api/v1/users`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUser {
    name: String,
    password: String,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    limits: Limits,
}

/// `PUT .../limits`'s body, and a new user's `limits`: the per-user settings of
/// `[[auth.user]]` (absent: `limits.user_rate_*`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Limits {
    rate_up: Option<String>,
    rate_down: Option<String>,
}

impl Limits {
    fn check(&self) -> Result<(), String> {
        for (what, r) in [("rate_up", &self.rate_up), ("rate_down", &self.rate_down)] {
            if let Some(r) = r {
                crate::limits::parse_rate(r).map_err(|e| format!("{what}: {e}"))?;
            }
        }
        Ok(())
    }
}

/// The body as `T`. The error names the place and the kind of the problem only: serde's
/// own message may quote a value, and a body may hold a password.
fn parse<T: for<'de> Deserialize<'de>>(body: &[u8], expected: &str) -> Result<T, Reply> {
    serde_json::from_slice(body).map_err(|e| {
        let kind = match e.classify() {
            serde_json::error::Category::Io | serde_json::error::Category::Eof => "incomplete",
            serde_json::error::Category::Syntax => "malformed",
            serde_json::error::Category::Data => "unexpected fields or types in the",
        };
        let at = format!("line {} column {}", e.line(), e.column());
        Reply::error(400, &format!("{kind} JSON body at {at} (expected {expected})"))
    })
}

/// Runs `f` on the blocking pool (hashing, saving, building a policy).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Reply> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Reply::error(500, &format!("the change did not run: {e}")))
}

/// Saves the overlay changed by `f` and puts a policy with it in force.
async fn commit(
    users: &UsersState,
    f: impl FnOnce(&mut crate::policy::overlay::State) + Send + 'static,
) -> Result<(), Reply> {
    commit_then(users, f, || {}).await
}

/// `commit`, running `saved` once the change is saved and before the policy with it is
/// built: a change that is not saved has no effect, one saved is in force even if the
/// policy fails to build now (it is the one the next reload builds).
async fn commit_then(
    users: &UsersState,
    f: impl FnOnce(&mut crate::policy::overlay::State) + Send + 'static,
    saved: impl FnOnce() + Send + 'static,
) -> Result<(), Reply> {
    let (overlay, republish) = (users.overlay.clone(), users.republish.clone());
    blocking(move || {
        overlay.update(|s| {
            f(s);
            Ok::<_, String>(())
        })?;
        saved();
        republish().map_err(|e| format!("{e} (the change is saved: a reload puts it in force)"))
    })
    .await?
    .map_err(|e| {
        tracing::error!("admin: users change: {e}");
        Reply::error(500, &e)
    })
}

async fn add(users: &UsersState, policy: &Policy, body: &[u8]) -> Result<Reply, Reply> {
    let new: NewUser = parse(body, "name, password, groups, limits")?;
    check_user_name(&new.name).map_err(|e| Reply::error(400, &e))?;
    for g in &new.groups {
        crate::policy::auth::check_name("group", g).map_err(|e| Reply::error(400, &e))?;
    }
    if new.password.is_empty() {
        return Err(Reply::error(400, "empty password"));
    }
    new.limits.check().map_err(|e| Reply::error(400, &e))?;
    if exists(policy, &new.name) {
        return Err(Reply::error(409, &format!("user `{}` exists", new.name)));
    }
    let password = new.password;
    let hash = blocking(move || crate::policy::auth::hash_password(password.as_bytes()))
        .await?
        .map_err(|e| Reply::error(500, &e))?;
    let name = new.name.clone();
    let entry = Entry {
        password: Some(hash),
        groups: new.groups,
        rate_up: new.limits.rate_up,
        rate_down: new.limits.rate_down,
        ..Entry::default()
    };
    commit(users, move |s| {
        s.users.insert(name, entry);
    })
    .await?;
    Ok(Reply::json(201, &json!({ "name": new.name })))
}

/// Changes an existing user's overlay entry with `f`; with `reason`, its open connections
/// are cut once the change is saved.
async fn change(
    users: &UsersState,
    policy: &Policy,
    name: String,
    reason: Option<Cut>,
    f: impl FnOnce(&mut Entry) + Send + 'static,
) -> Result<Reply, Reply> {
    if !exists(policy, &name) {
        return Err(not_found(&name));
    }
    change_name(users, name, reason, f).await
}

/// `change` of a name whether a user has it or not (one a client certificate names).
async fn change_name(
    users: &UsersState,
    name: String,
    reason: Option<Cut>,
    f: impl FnOnce(&mut Entry) + Send + 'static,
) -> Result<Reply, Reply> {
    let key = name.clone();
    // Cut once saved, before the policy without the user is built (so that it is not
    // called removed); a change not saved cuts nothing.
    let (traffic, cut_name) = (users.traffic.clone(), name.clone());
    let saved = move || {
        if let Some(reason) = reason {
            if let Some(t) = traffic.find(&cut_name) {
                cut(&t, reason);
            }
        }
    };
    commit_then(users, move |s| f(s.users.entry(key).or_default()), saved).await?;
    Ok(Reply::json(200, &json!({ "name": name })))
}

async fn set_limits(
    users: &UsersState,
    policy: &Policy,
    name: String,
    body: &[u8],
) -> Result<Reply, Reply> {
    let limits: Limits = parse(body, "rate_up, rate_down")?;
    limits.check().map_err(|e| Reply::error(400, &e))?;
    change(users, policy, name, None, move |e| {
        e.rate_up = limits.rate_up;
        e.rate_down = limits.rate_down;
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_decoded_and_checked() {
        assert_eq!(user_name("alice").as_deref(), Ok("alice"));
        assert_eq!(user_name("a%40b").as_deref(), Ok("a@b"));
        assert!(user_name("").is_err());
        assert!(user_name("a%2Fb").is_err(), "no '/' decoded");
        assert!(user_name("a%0Ab").is_err(), "no control character");
        assert!(user_name("a%zz").is_err());
        assert!(user_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn routes_fit_their_paths_only() {
        assert!(fits(ROUTES[0].1, &["users"]));
        assert!(fits(ROUTES[4].1, &["users", "bob", "disable"]));
        assert!(!fits(ROUTES[4].1, &["users", "bob", "enable"]));
        assert!(!fits(ROUTES[2].1, &["users", "bob", "x"]));
    }
}
