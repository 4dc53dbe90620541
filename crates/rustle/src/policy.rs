//! The reloadable part of the configuration: users, access rules, built-in destination
//! checks, bandwidth per user, parents and routes. Built at start and again on SIGHUP;
//! each worker holds the current one and every connection reads it without a lock.

pub mod auth;
pub(crate) mod dns;
pub mod overlay;
pub(crate) mod route;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use crate::acl::{canonical, Builtins, Protocol, Request, RuleSet, Verdict};
use crate::config::{Config, DefaultAction, ListenerKey};
use crate::limits::addrs::Limit as AddressLimit;
use crate::limits::{parse_rate, Bucket, Limit, Throttle};
use crate::policy::auth::{User, Users};

pub(crate) use crate::error::Denial;

/// A listener as it runs: its settings, and the state it keeps while it runs (across a
/// reload that keeps it). It reads as its settings (`Deref`), so that the front ends,
/// which see little else of a listener, read `listener.kind` as before.
#[derive(Debug, Clone)]
pub struct Listener {
    pub(crate) config: crate::config::Listener,
    /// The buckets of `rate_up`/`rate_down`, shared by all its connections.
    pub(crate) throttle: Throttle,
    /// Its counters, a slot per worker.
    pub(crate) counters: Arc<crate::telemetry::metrics::ListenerCounters>,
}

impl Listener {
    /// A listener new to the process: its buckets made, its counters at zero.
    pub(crate) fn new(config: crate::config::Listener, workers: usize) -> Result<Listener, String> {
        let throttle = listener_throttle(&config)?;
        let counters = crate::telemetry::metrics::ListenerCounters::new(workers);
        Ok(Listener { config, throttle, counters })
    }

    /// `config` in place of `was`, a running listener of the same key: its counters go on,
    /// and its buckets too unless the rates change.
    pub(crate) fn succeeding(
        config: crate::config::Listener,
        was: &Listener,
    ) -> Result<Listener, String> {
        let same_rates = config.rate_up == was.rate_up && config.rate_down == was.rate_down;
        let throttle = match same_rates {
            true => was.throttle.clone(),
            false => listener_throttle(&config)?,
        };
        Ok(Listener { config, throttle, counters: was.counters.clone() })
    }
}

impl std::ops::Deref for Listener {
    type Target = crate::config::Listener;

    fn deref(&self) -> &crate::config::Listener {
        &self.config
    }
}

impl std::ops::DerefMut for Listener {
    fn deref_mut(&mut self) -> &mut crate::config::Listener {
        &mut self.config
    }
}

/// The buckets of a listener's own bandwidth limit.
fn listener_throttle(l: &crate::config::Listener) -> Result<Throttle, String> {
    let make = |r: &Option<String>| -> Result<Option<Arc<Bucket>>, String> {
        Ok(match r {
            Some(r) => {
                let rate = parse_rate(r).map_err(|e| format!("listener {}: {e}", l.listen))?;
                Some(Arc::new(Bucket::new(rate, Bucket::default_burst(rate))))
            }
            None => None,
        })
    };
    Ok(Throttle {
        up: Limit { user: None, listener: make(&l.rate_up)? },
        down: Limit { user: None, listener: make(&l.rate_down)? },
    })
}

/// A user's buckets, client to upstream and back.
type UserBuckets = (Option<Arc<Bucket>>, Option<Arc<Bucket>>);

pub struct Policy {
    pub users: Users,
    /// Users the admin API disabled: listed by it, never authenticated.
    pub(crate) disabled: Users,
    /// Names the admin API disabled or removed, with why (`Cut::Disabled` or
    /// `Cut::Removed`): refused however they authenticate (a client certificate naming
    /// one too).
    refused_names: HashMap<Box<str>, crate::limits::Cut>,
    pub(crate) rules: RuleSet,
    pub(crate) builtins: Builtins,
    pub(crate) realm: String,
    /// Bytes per second (up, down) of each user with a limit of its own.
    user_rates: UserRates,
    default_user_rate: (Option<u64>, Option<u64>),
    /// Each limited user's buckets, made on first use and shared by its connections.
    user_buckets: Mutex<HashMap<String, UserBuckets>>,
    /// Client addresses per user (`max_client_addresses`): of users whose own limit or
    /// whose groups' differ from `[limits]`, and everyone else's.
    address_limits: HashMap<String, Option<AddressLimit>>,
    default_address_limit: Option<AddressLimit>,
    /// TLS accepted by the listeners that have it (by `Listener::key`, so that a reload
    /// reordering listeners gives each its own certificates), certificates loaded.
    tls_accept: Vec<(ListenerKey, Arc<crate::io::tls::Acceptor>)>,
    /// TLS originated by relay listeners towards their targets, by `Listener::key`.
    tls_connect: Vec<(ListenerKey, Arc<rustls::ClientConfig>)>,
    /// TLS towards origins of `https://` URLs, or why there is none (no CA to verify
    /// with: such requests then get a 502 saying so).
    https_origins: Result<Arc<rustls::ClientConfig>, String>,
    /// Rules and routes naming a group no user is in or a user that is not defined
    /// (`undefined_names`: usually a misspelling; such a rule matches nobody), and user
    /// names that read as another user with parameters (`users_with_parameters`).
    pub(crate) undefined_names: Vec<String>,
    /// A listener requires authentication and no user is defined: everyone is refused.
    pub(crate) auth_without_users: bool,
    /// Parents, groups and routes.
    pub(crate) routes: crate::policy::route::Routes,
    /// The user-name parameters `[auth.params]` declares; None: names are taken whole.
    pub(crate) params: Option<crate::policy::auth::params::Declared>,
    /// `[[auth.backend]]` in order; empty: the users file alone.
    pub(crate) backends: crate::policy::auth::backend::Chain,
    /// TLS towards each `https` parent (by parent index), verified with its `ca` or the
    /// system's roots.
    parent_tls: Vec<Option<Arc<rustls::ClientConfig>>>,
    /// `[auth.kerberos]`: Negotiate tokens accepted with the keytab read at this build.
    pub(crate) negotiate: Option<Arc<crate::policy::auth::negotiate::Acceptor>>,
    /// What the resolver reads besides `[dns]` (hosts, resolv.conf, its TLS roots).
    pub(crate) dns: Arc<dns::System>,
    /// The whole configuration this policy was built from: workers read its timeouts,
    /// limits and log settings for each new connection, so that a reload changes them too.
    pub(crate) config: Arc<Config>,
}

/// ALPN of the HTTPS proxy port, in order of preference: HTTP/2 when the client offers
/// it (many tunnels on one connection), HTTP/1.1 otherwise.
pub(crate) const HTTPS_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

fn rate(r: &Option<String>, what: &str) -> Result<Option<u64>, String> {
    r.as_deref().map(|s| parse_rate(s).map_err(|e| format!("{what}: {e}"))).transpose()
}

impl Policy {
    /// Why `user` is refused on every path (a certificate's too), when the admin API
    /// disabled or removed it: `Cut::Disabled` or `Cut::Removed`.
    pub(crate) fn refused_as(&self, user: &str) -> Option<&crate::limits::Cut> {
        if self.refused_names.is_empty() {
            return None;
        }
        self.refused_names.get(user)
    }

    /// What `rustle check` and start-up refuse and a reload only warns of. Each makes the
    /// proxy refuse more, not less, and refusing a reload for it would keep what the new
    /// files removed (a revoked user, the last member of a group) in force.
    pub(crate) fn startup_problems(&self) -> Vec<String> {
        refused_at_start(self.undefined_names.clone(), self.auth_without_users)
    }

    /// Every problem of a configuration's policy: what `build` refuses (files that cannot
    /// be read or parsed, certificates, users, rules, routes) and what start-up refuses
    /// (`startup_problems`), both at once.
    pub(crate) fn check(cfg: &Config) -> Vec<String> {
        match Policy::build(cfg, &[]) {
            Ok(policy) => policy.startup_problems(),
            // Which names are undefined is known only with the users file read.
            Err(problems) if users_file_unread(cfg) => problems,
            Err(mut problems) => {
                let (users, _, _, _) = users_of(cfg, None);
                let undefined = undefined_names(cfg, &users);
                problems.extend(refused_at_start(undefined, auth_without_users(cfg, &users)));
                problems
            }
        }
    }

    /// What the listener `key` names accepts as TLS, if it does.
    pub(crate) fn tls_acceptor(&self, key: &ListenerKey) -> Option<&Arc<crate::io::tls::Acceptor>> {
        self.tls_accept.iter().find(|(k, _)| k == key).map(|(_, a)| a)
    }

    /// The client config of relay listener `key`'s TLS towards its target.
    pub(crate) fn tls_connector(&self, key: &ListenerKey) -> Option<&Arc<rustls::ClientConfig>> {
        self.tls_connect.iter().find(|(k, _)| k == key).map(|(_, c)| c)
    }

    /// The client config towards `https` parent `index`.
    pub(crate) fn parent_tls(&self, index: usize) -> Option<&Arc<rustls::ClientConfig>> {
        self.parent_tls.get(index).and_then(Option::as_ref)
    }

    /// The client config for origins of `https://` URLs.
    pub(crate) fn https_origins(&self) -> Result<&Arc<rustls::ClientConfig>, &str> {
        self.https_origins.as_ref().map_err(String::as_str)
    }

    /// Builds the policy; `own` are the proxy's listening addresses (for loop refusal).
    pub fn build(cfg: &Config, own: &[SocketAddr]) -> Result<Policy, Vec<String>> {
        Policy::build_with(cfg, own, None)
    }

    /// `build`, with the admin API's users (`overlay`) on top of the configuration's.
    pub(crate) fn build_with(
        cfg: &Config,
        own: &[SocketAddr],
        overlay: Option<&overlay::State>,
    ) -> Result<Policy, Vec<String>> {
        let (users, disabled, user_rates, mut problems) = users_of(cfg, overlay);
        let undefined_names = undefined_names(cfg, &users);
        let routes = crate::policy::route::Routes::build(cfg, own).unwrap_or_else(|errs| {
            problems.extend(errs);
            crate::policy::route::Routes::default()
        });
        problems.extend(routes.host_problems());
        let default_allow = cfg.default_action == DefaultAction::Allow;
        let rules = RuleSet::compile(&cfg.rules, default_allow).unwrap_or_else(|errs| {
            for (i, e) in errs {
                problems.push(format!("rule {}: {e}", i + 1));
            }
            RuleSet::compile(&[], default_allow).unwrap_or_else(|_| unreachable!())
        });
        let default_user_rate = match (
            rate(&cfg.limits.user_rate_up, "limits.user_rate_up"),
            rate(&cfg.limits.user_rate_down, "limits.user_rate_down"),
        ) {
            (Ok(up), Ok(down)) => (up, down),
            (Err(e), _) | (_, Err(e)) => {
                problems.push(e);
                (None, None)
            }
        };
        let mut tls_accept = Vec::new();
        let mut tls_connect = Vec::new();
        for (i, l) in cfg.effective_listeners().iter().enumerate() {
            let what = format!("listener {} ({})", i + 1, l.listen);
            let alpn = match l.kind {
                crate::config::ListenerKind::Relay => &[][..],
                _ => HTTPS_ALPN,
            };
            if let Some(t) = &l.tls {
                match crate::io::tls::acceptor(t, alpn) {
                    Ok(a) => tls_accept.push((l.key, Arc::new(a))),
                    Err(e) => problems.push(format!("{what}: tls: {e}")),
                }
            }
            if let Some(t) = &l.target_tls {
                let named =
                    l.target.as_ref().map(|target| crate::io::tls::server_name(t, &target.host));
                match named.transpose().and_then(|_| crate::io::tls::connector(t)) {
                    Ok(c) => tls_connect.push((l.key, c)),
                    Err(e) => problems.push(format!("{what}: target_tls: {e}")),
                }
            }
        }
        let origins = crate::config::ConnectTls {
            ca: cfg.tls.origin_ca.clone(),
            insecure: cfg.tls.origin_insecure,
            ..Default::default()
        };
        let https_origins = crate::io::tls::connector(&origins);
        if let (Some(_), Err(e)) = (&cfg.tls.origin_ca, &https_origins) {
            problems.push(format!("tls.origin_ca: {e}"));
        }
        let parent_tls = cfg
            .parents
            .iter()
            .map(|parent| {
                if parent.kind != crate::config::ParentKind::Https {
                    return None;
                }
                let t = crate::config::ConnectTls { ca: parent.ca.clone(), ..Default::default() };
                crate::io::tls::connector(&t)
                    .map_err(|e| problems.push(format!("parent `{}`: {e}", parent.name)))
                    .ok()
            })
            .collect();
        let dns = dns::System::read(&cfg.dns).unwrap_or_else(|e| {
            problems.push(e);
            dns::System::default()
        });
        let negotiate = cfg.auth.kerberos.as_ref().and_then(|k| {
            let wrong = k.problems();
            if !wrong.is_empty() {
                problems.extend(wrong);
                return None;
            }
            crate::policy::auth::negotiate::Acceptor::new(k)
                .map(Arc::new)
                .map_err(|e| problems.push(e))
                .ok()
        });
        let backends =
            crate::policy::auth::backend::Chain::build(&cfg.auth.backends, cfg.auth.refusal_delay)
                .unwrap_or_else(|errs| {
                    problems.extend(errs);
                    Default::default()
                });
        let auth_without_users = auth_without_users(cfg, &users);
        let (address_limits, default_address_limit) = address_limits(cfg, &users);
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Policy {
            backends,
            routes,
            params: cfg.auth.params.as_ref().map(crate::policy::auth::params::Declared::new),
            parent_tls,
            negotiate,
            dns: Arc::new(dns),
            undefined_names,
            auth_without_users,
            users,
            disabled,
            rules,
            builtins: Builtins {
                own_addresses: own.to_vec(),
                deny_private: cfg.deny_private_destinations,
            },
            realm: cfg.auth.realm.clone(),
            user_rates,
            default_user_rate,
            refused_names: overlay
                .map(|o| {
                    o.users
                        .iter()
                        .filter(|(_, e)| e.refused())
                        .map(|(n, e)| {
                            let why = if e.removed {
                                crate::limits::Cut::Removed
                            } else {
                                crate::limits::Cut::Disabled
                            };
                            (n.as_str().into(), why)
                        })
                        .collect()
                })
                .unwrap_or_default(),
            tls_accept,
            tls_connect,
            https_origins,
            user_buckets: Mutex::new(HashMap::new()),
            address_limits,
            default_address_limit,
            config: Arc::new(cfg.clone()),
        })
    }

    /// The rates (bytes per second, up and down) that limit `user`: its own, each
    /// direction it does not set falling back to `limits.user_rate_*`.
    /// A user an external backend accepted with a bandwidth has it each way.
    pub(crate) fn user_rate(&self, user: &str) -> (Option<u64>, Option<u64>) {
        let (up, down) = match self.user_rates.get(user) {
            Some(r) => *r,
            None if !self.backends.is_empty() && self.users.get(user).is_none() => {
                let rate = crate::policy::auth::identity::bandwidth(user, &self.backends);
                (rate, rate)
            }
            None => (None, None),
        };
        (up.or(self.default_user_rate.0), down.or(self.default_user_rate.1))
    }

    /// The buckets limiting `user`, if any.
    pub(crate) fn user_limits(&self, user: &str) -> (Limit, Limit) {
        let (up, down) = self.user_rate(user);
        if up.is_none() && down.is_none() {
            return (Limit::default(), Limit::default());
        }
        let mut map = self.user_buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (bu, bd) = map.entry(user.to_string()).or_insert_with(|| {
            let make =
                |r: Option<u64>| r.map(|r| Arc::new(Bucket::new(r, Bucket::default_burst(r))));
            (make(up), make(down))
        });
        (Limit { user: bu.clone(), listener: None }, Limit { user: bd.clone(), listener: None })
    }

    /// How many client addresses `user` may use at once, and for how long a closed one
    /// stays in use; None: no limit.
    pub(crate) fn client_addresses(&self, user: &str) -> Option<AddressLimit> {
        match self.address_limits.get(user) {
            Some(limit) => *limit,
            None => self.default_address_limit,
        }
    }

    /// The throttle for a connection: the listener's buckets plus the user's.
    pub(crate) fn throttle(&self, listener: &Throttle, user: Option<&str>) -> Throttle {
        let user_limits = !self.user_rates.is_empty()
            || self.default_user_rate != (None, None)
            || (!self.backends.is_empty() && crate::policy::auth::identity::any_bandwidth());
        if !user_limits && listener.is_unlimited() {
            return Throttle::default();
        }
        let mut t = listener.clone();
        if let (Some(u), true) = (user, user_limits) {
            let (up, down) = self.user_limits(u);
            t.up.user = up.user;
            t.down.user = down.user;
        }
        t
    }
}

/// Bytes per second (up, down) of each user with a limit of its own.
type UserRates = HashMap<String, (Option<u64>, Option<u64>)>;

/// The users of a configuration (its users file, then `[auth]`'s users and groups), the
/// bandwidth of those with their own, and the problems found on the way.
fn users_of(
    cfg: &Config,
    overlay: Option<&overlay::State>,
) -> (Users, Users, UserRates, Vec<String>) {
    let mut problems = Vec::new();
    let mut users = match &cfg.auth.users_file {
        Some(path) => Users::load(path).unwrap_or_else(|e| {
            problems.push(e);
            Users::default()
        }),
        None => Users::default(),
    };
    let mut user_rates = HashMap::new();
    let mut disabled = Users::default();
    for u in &cfg.auth.users {
        if let Err(e) = users.add(&u.name, &u.password, &u.groups) {
            problems.push(format!("auth.user `{}`: {e}", u.name));
        }
        match (rate(&u.rate_up, "rate_up"), rate(&u.rate_down, "rate_down")) {
            (Ok(None), Ok(None)) => {}
            (Ok(up), Ok(down)) => {
                user_rates.insert(u.name.clone(), (up, down));
            }
            (Err(e), _) | (_, Err(e)) => problems.push(format!("auth.user `{}`: {e}", u.name)),
        }
    }
    if let Some(state) = overlay {
        problems.extend(overlay::apply(state, &mut users, &mut disabled));
        for (name, e) in &state.users {
            match (rate(&e.rate_up, "rate_up"), rate(&e.rate_down, "rate_down")) {
                (Ok(None), Ok(None)) => {}
                // A direction the API leaves unset keeps the `[[auth.user]]` one.
                (Ok(up), Ok(down)) => {
                    let (was_up, was_down) = user_rates.get(name).copied().unwrap_or_default();
                    user_rates.insert(name.clone(), (up.or(was_up), down.or(was_down)));
                }
                (Err(e), _) | (_, Err(e)) => {
                    problems.push(format!("users state: user `{name}`: {e}"))
                }
            }
        }
    }
    for (group, members) in &cfg.auth.groups {
        users.add_group_members(group, members);
    }
    for (group, member) in users.undefined_members() {
        // A member the admin API disabled or removed is no mistake of the file's.
        if overlay.and_then(|o| o.users.get(&member)).is_some_and(overlay::Entry::refused) {
            continue;
        }
        problems.push(format!("auth.groups: `{member}` in group `{group}` is not a user"));
    }
    (users, disabled, user_rates, problems)
}

/// Client addresses per user: the limit of every user whose own (`[[auth.user]]`) or
/// whose groups' (`[auth.group_limits]`) differ from `[limits]`'s, and `[limits]`'s. A
/// user's own value wins, then the most generous of its groups', then `[limits]`'s; the
/// count and the TTL are taken each on its own.
type AddressLimits = (HashMap<String, Option<AddressLimit>>, Option<AddressLimit>);

fn address_limits(cfg: &Config, users: &Users) -> AddressLimits {
    let l = &cfg.limits;
    let limit = |max: Option<usize>, ttl| max.map(|max| AddressLimit { max, ttl });
    let default = limit(l.max_client_addresses, l.client_address_ttl);
    let mut out = HashMap::new();
    let groups = &cfg.auth.group_limits;
    let own: HashMap<&str, _> = cfg.auth.users.iter().map(|u| (u.name.as_str(), u)).collect();
    for name in users.names() {
        let own = own.get(name);
        let member_of: Vec<_> = match users.get(name) {
            Some(u) => groups.iter().filter(|(g, _)| u.in_group(g)).map(|(_, l)| l).collect(),
            None => Vec::new(),
        };
        let own_max = own.and_then(|u| u.max_client_addresses);
        let own_ttl = own.and_then(|u| u.client_address_ttl);
        if own_max.is_none() && own_ttl.is_none() && member_of.is_empty() {
            continue;
        }
        let max = own_max
            .or_else(|| member_of.iter().filter_map(|g| g.max_client_addresses).max())
            .or(l.max_client_addresses);
        let ttl = own_ttl
            .or_else(|| member_of.iter().filter_map(|g| g.client_address_ttl).max())
            .unwrap_or(l.client_address_ttl);
        out.insert(name.to_string(), limit(max, ttl));
    }
    (out, default)
}

/// The configuration names a users file that cannot be read or parsed.
fn users_file_unread(cfg: &Config) -> bool {
    cfg.auth.users_file.as_deref().is_some_and(|path| Users::load(path).is_err())
}

/// Groups and users named by rules and routes that no user is in or that no user is
/// (`line N: rule K: ...`). Users named by client certificates or accepted whatever
/// credentials they give are known only when they connect: with a listener taking those,
/// rules may name anyone.
fn undefined_names(cfg: &Config, users: &Users) -> Vec<String> {
    use crate::acl::{undefined_groups, undefined_users};
    use crate::config::{CertUser, ClientCerts};
    // Users and groups an external backend names are known only when they log in.
    let external = cfg.auth.backends.iter().any(|b| b.common().is_some());
    if external {
        return users_with_parameters(cfg, users);
    }
    let defined = |g: &str| users.has_group(g) || cfg.auth.groups.contains_key(g);
    let rules = || cfg.rules.iter().map(|r| &r.conditions);
    let routes = || cfg.routes.iter().map(|r| &r.conditions);
    let mut out = undefined_groups(rules(), "rule", defined);
    for group in cfg.auth.group_limits.keys().filter(|g| !defined(g)) {
        out.push(format!("auth.group_limits: no user is in the group `{group}`"));
    }
    out.extend(undefined_groups(routes(), "route", defined));
    let users_from_elsewhere = cfg.effective_listeners().iter().any(|l| {
        let certs = l.tls.as_ref().is_some_and(|t| {
            t.client_certs != ClientCerts::None && t.client_user != CertUser::None
        });
        certs || l.accept_any_credentials || cfg.auth.kerberos.is_some()
    });
    if !users_from_elsewhere {
        let known = |u: &str| users.get(u).is_some();
        out.extend(undefined_users(rules(), "rule", known));
        out.extend(undefined_users(routes(), "route", known));
    }
    out.extend(users_with_parameters(cfg, users));
    out
}

/// With `[auth.params]`, users whose names read as another user with parameters
/// (`alice-country-de` or `alice-session` beside `alice`): a name that is a user is taken
/// whole, and the longest user wins, so that other user could never give those
/// parameters (`Declared::shadows`). Sorted.
fn users_with_parameters(cfg: &Config, users: &Users) -> Vec<String> {
    let Some(p) = &cfg.auth.params else { return Vec::new() };
    let declared = crate::policy::auth::params::Declared::new(p);
    let mut out: Vec<String> = users
        .names()
        .filter_map(|name| {
            let user = declared.shadows(name, |u| users.get(u).is_some())?;
            Some(format!(
                "user `{name}` reads as the user `{user}` with parameters ([auth.params], \
                 separator `{}`): the name is always that user's, so `{user}` could never give \
                 them; rename one of the two",
                p.separator
            ))
        })
        .collect();
    out.sort();
    out
}

/// A listener requires authentication and no user is defined: everyone is refused.
fn auth_without_users(cfg: &Config, users: &Users) -> bool {
    let elsewhere =
        cfg.auth.backends.iter().any(|b| b.common().is_some()) || cfg.auth.kerberos.is_some();
    cfg.effective_listeners().iter().any(|l| l.auth) && users.is_empty() && !elsewhere
}

/// What start-up refuses and a reload only warns of (`Policy::startup_problems`).
fn refused_at_start(mut undefined_names: Vec<String>, auth_without_users: bool) -> Vec<String> {
    if auth_without_users {
        undefined_names
            .push("a listener requires authentication but [auth] defines no user".into());
    }
    undefined_names
}

/// One access decision in the making: who asks for what.
pub(crate) struct Access<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) listener: Option<&'a str>,
    pub(crate) client: IpAddr,
    pub(crate) user: Option<UserView<'a>>,
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) protocol: Protocol,
    /// The parameters of the user name, if it had any.
    pub(crate) params: Option<&'a crate::acl::Params>,
}

/// The user an access decision sees: one of the users file, or one an external backend
/// accepted (its name and the groups the backend gave, `auth::identity`).
pub(crate) enum UserView<'a> {
    File(&'a User),
    External(&'a str, std::rc::Rc<[String]>),
}

impl<'a> UserView<'a> {
    /// The view of the user `name`: the users file's, else, with external backends, what
    /// one granted it on this worker (no groups when none did).
    pub(crate) fn of(policy: &'a Policy, name: &'a str) -> Option<UserView<'a>> {
        match policy.users.get(name) {
            Some(u) => Some(UserView::File(u)),
            None if policy.backends.is_empty() => None,
            None => Some(UserView::External(
                name,
                crate::policy::auth::identity::groups(name, &policy.backends),
            )),
        }
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            UserView::File(u) => &u.name,
            UserView::External(n, _) => n,
        }
    }

    pub(crate) fn groups(&self) -> &[String] {
        match self {
            UserView::File(u) => &u.groups,
            UserView::External(_, g) => g,
        }
    }
}

impl Access<'_> {
    pub(crate) fn request(&self, dest: Option<IpAddr>) -> Request<'_> {
        Request {
            listener: self.listener,
            client: self.client,
            user: self.user.as_ref().map(UserView::name),
            groups: self.user.as_ref().map_or(&[], UserView::groups),
            host: self.host,
            port: self.port,
            protocol: self.protocol,
            dest,
            params: self.params,
        }
    }

    fn denial(&self, rule: Option<usize>, reason: &'static str) -> Denial {
        let rule = match rule {
            Some(i) => format!("rule `{}`", self.policy.rules.rule_name(i)),
            None => "the default action".to_string(),
        };
        Denial { rule, reason }
    }

    /// Before resolving: Ok(true) when the decision needs the destination address.
    pub(crate) fn precheck(&self) -> Result<bool, Denial> {
        match self.policy.rules.check(&self.request(None)) {
            Verdict::Allow => Ok(false),
            Verdict::NeedAddress => Ok(true),
            Verdict::Deny { rule, reason } => Err(self.denial(rule, reason)),
        }
    }

    /// The rules alone on `ip`, when the precheck said they need an address: a BIND's
    /// peer, which connects to the proxy rather than being connected to, so that the
    /// destination protections do not apply.
    pub(crate) fn check_rules(&self, ip: IpAddr) -> Option<Denial> {
        match self.policy.rules.check(&self.request(Some(canonical(ip)))) {
            Verdict::Allow => None,
            Verdict::Deny { rule, reason } => Some(self.denial(rule, reason)),
            Verdict::NeedAddress => Some(self.denial(None, "undecidable")),
        }
    }

    /// On each address about to be connected to: the built-in checks, then (when the
    /// precheck could not decide) the rules.
    pub(crate) fn check_addr(&self, addr: SocketAddr, rules_too: bool) -> Option<Denial> {
        if let Some(reason) = self.policy.builtins.check(addr) {
            return Some(Denial { rule: "built-in protection".into(), reason });
        }
        if !rules_too {
            return None;
        }
        // Connecting to 0.0.0.0 or :: reaches this host: rules see it as loopback, so the
        // unspecified address cannot slip past a rule about 127.0.0.0/8 or ::1.
        let ip = match addr.ip() {
            IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        match self.policy.rules.check(&self.request(Some(ip))) {
            Verdict::Allow => None,
            Verdict::Deny { rule, reason } => Some(self.denial(rule, reason)),
            Verdict::NeedAddress => Some(self.denial(None, "undecidable")),
        }
    }
}
