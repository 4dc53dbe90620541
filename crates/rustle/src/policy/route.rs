//! Parents, groups and routes compiled into a routing table: which way a request goes
//! ([`Routes::choose`]), and which parent a hop takes for one connection
//! ([`Routes::pick`]). Pure: no I/O, no lock; it lives in `policy::Policy`, shared by every
//! worker, and the only state that changes is each parent's [`Health`] and each group's
//! turn counter (atomics), and the sticky sessions of routes that have them (`sticky`:
//! a table behind small locks, touched only by requests on those routes).
//!
//! Choices made here:
//! - A group picks by weight with a shared turn counter stepped once per connection and
//!   spread by the golden ratio (a Weyl sequence, evenly spread): each member's share of
//!   any run of connections stays close to its weight (3:1 gives 73 to 77 of 100), with
//!   no lock and one atomic add per pick.
//! - `sticky = "user"` / `"client"`: weighted rendezvous hashing of the user name (the
//!   client address for anonymous clients) or the client address with each member's name.
//!   A member going down moves only its own users; when it is back they return to it.
//! - A seed (`Want::seed`, from a route's sticky session: [`Routes::seed`]) replaces the
//!   user or client in that hash, whatever the group's own `sticky`: a session keeps its
//!   member while it is up, and a new session lands anywhere.
//! - A member that is down is skipped. With every member down the group's `fallback`
//!   decides: `deny`, `direct`, another group (followed, at most once per group), or a
//!   parent, refused when that parent is down too.
//! - A hop naming one parent that is down is refused at once with a reason naming it,
//!   rather than tried again and again as 3proxy does: the client gets its answer
//!   without waiting for a connect timeout, and the parent is tried again once its
//!   `down_for` has passed (or its probe succeeds). `max_failures = 0` keeps a parent from
//!   ever being marked down, for those who want every connection to try it.
//! - Health: `max_failures` consecutive failures mark a parent down for `down_for`; after
//!   that it is tried again half-open: one more failure marks it down again at once, one
//!   success ([`Health::succeeded`]) makes it healthy.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) mod egress;

use crate::acl::{Match, Params, Request, RuleSet};
use crate::config::{Config, Named};
pub(crate) use crate::config::{ParentKind, Probe, Secret, Sticky, StickyBy};

mod sticky;

/// A parent proxy, compiled.
#[derive(Debug, Clone)]
pub(crate) struct Parent {
    /// Its position in `[[parent]]` order, for [`Routes::parent`].
    pub(crate) index: usize,
    pub(crate) name: Box<str>,
    pub(crate) kind: ParentKind,
    /// As written (lowercase; IPv6 without brackets): resolved by the caller.
    pub(crate) host: Box<str>,
    pub(crate) port: u16,
    pub(crate) user: Option<Box<str>>,
    pub(crate) password: Option<Secret>,
    /// Send the client's user name instead of `user` ([`Parent::user_for`]).
    pub(crate) pass_user: bool,
    /// `https`: the name sent (SNI) and verified (the host unless configured).
    pub(crate) server_name: Box<str>,
    pub(crate) weight: u32,
    /// Consecutive failures that mark it down; 0: never.
    pub(crate) max_failures: u32,
    pub(crate) down_for: Duration,
    pub(crate) probe: Option<Probe>,
    pub(crate) probe_every: Duration,
    /// A PROXY protocol header first on each new connection to it.
    pub(crate) proxy_protocol: Option<crate::config::ProxyProtocol>,
    /// Shared with the same parent in the policy before a reload
    /// ([`Routes::keep_health_of`]), so that connections opened under either count.
    pub(crate) health: Arc<Health>,
}

impl Parent {
    /// The user name to send: the client's own with `pass_user` (when it has one), the
    /// configured `user` otherwise.
    pub(crate) fn user_for<'a>(&'a self, client_user: Option<&'a str>) -> Option<&'a str> {
        match (self.pass_user, client_user) {
            (true, Some(user)) => Some(user),
            _ => self.user.as_deref(),
        }
    }

    pub(crate) fn is_up(&self, now: Instant) -> bool {
        self.health.is_up(now)
    }

    /// A connection through it failed; true when this failure marked it down.
    pub(crate) fn failed(&self, now: Instant) -> bool {
        self.health.failed(now, self.max_failures, self.down_for)
    }

    /// A connection through it (or a probe) succeeded; true when it was down.
    pub(crate) fn succeeded(&self) -> bool {
        self.health.succeeded()
    }
}

impl fmt::Display for Parent {
    /// `parent "corp" (10.0.0.1:3128)`: how errors and logs name it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "parent \"{}\" ([{}]:{})", self.name, self.host, self.port)
        } else {
            write!(f, "parent \"{}\" ({}:{})", self.name, self.host, self.port)
        }
    }
}

/// The time health is kept in: milliseconds since the first use, so that a deadline fits
/// one atomic.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since [`epoch`], plus one so that 0 can mean "not down".
fn stamp(now: Instant) -> u64 {
    let ms = now.saturating_duration_since(epoch()).as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX - 1) + 1
}

/// A parent's health: consecutive failures, and until when it is down.
#[derive(Debug)]
pub(crate) struct Health {
    /// Failures and connect latency for `/metrics` (shared like the rest of the health).
    pub(crate) stats: crate::telemetry::metrics::ParentStats,
    failures: AtomicU32,
    /// [`stamp`] of the end of its down time; 0: never marked down since the last success.
    down_until: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        epoch();
        Health {
            stats: Default::default(),
            failures: AtomicU32::new(0),
            down_until: AtomicU64::new(0),
        }
    }
}

impl Health {
    /// Not down: never marked, or its down time is over (then it is tried half-open).
    pub(crate) fn is_up(&self, now: Instant) -> bool {
        let until = self.down_until.load(Ordering::Relaxed);
        until == 0 || stamp(now) >= until
    }

    /// Counts a failure; with `max_failures` in a row (or one, once tried again after its
    /// down time), marks it down for `down_for`. True when this failure marked it down;
    /// false when it stays up, or was already down (a connection begun before).
    /// `max_failures = 0`: never marked down.
    pub(crate) fn failed(&self, now: Instant, max_failures: u32, down_for: Duration) -> bool {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        let n = self.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if max_failures == 0 || n < max_failures {
            return false;
        }
        let now = stamp(now);
        let ms = u64::try_from(down_for.as_millis()).unwrap_or(u64::MAX);
        let until = now.saturating_add(ms).max(1);
        let mut current = self.down_until.load(Ordering::Relaxed);
        loop {
            if current != 0 && now < current {
                return false;
            }
            match self.down_until.compare_exchange_weak(
                current,
                until,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }

    /// A success: no failure counted, not down. True when it had been marked down.
    pub(crate) fn succeeded(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        self.down_until.swap(0, Ordering::Relaxed) != 0
    }

    #[cfg(test)]
    /// Consecutive failures so far (for metrics).
    pub(crate) fn failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// One hop of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    /// Index into [`Routes::parents`].
    Parent(usize),
    /// Index of a group ([`Routes::group_name`]).
    Group(usize),
}

/// Where a route sends what it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Via {
    Direct,
    Deny,
    /// Through these hops, first one first: each tunnels to the next, the last to the
    /// target.
    Hops(Box<[Hop]>),
}

/// What [`Routes::choose`] decided for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice<'a> {
    /// Straight to the target: by a route with `via = "direct"` (its name, and its
    /// outgoing addresses if it has any), or because no route matched (None).
    Direct { route: Option<&'a str>, egress: Option<&'a egress::Egress> },
    /// Refused by a route with `via = "deny"`.
    Deny { route: &'a str },
    /// A route with `destinations` may decide: resolve the target, then choose again with
    /// `dest` set (as `acl::Verdict::NeedAddress`).
    NeedAddress,
    Path {
        route: &'a str,
        hops: &'a [Hop],
        /// Where the connection to the first parent leaves from.
        egress: Option<&'a egress::Egress>,
    },
}

/// Which way one hop goes for one connection.
#[derive(Debug, Clone)]
pub(crate) enum Pick<'a> {
    Parent(&'a Arc<Parent>),
    /// A group's `fallback = "direct"`: this hop is skipped (the previous hop, or the
    /// proxy itself, connects to what comes after it).
    Direct,
    /// Nothing to go through: why, naming the parent or group.
    Deny(String),
}

/// Parents are the same when they are the same compiled parent.
impl PartialEq for Pick<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Pick::Parent(a), Pick::Parent(b)) => Arc::ptr_eq(a, b),
            (Pick::Direct, Pick::Direct) => true,
            (Pick::Deny(a), Pick::Deny(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Pick<'_> {}

/// Where a group goes when every member is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fallback {
    Deny,
    Direct,
    Parent(usize),
    Group(usize),
}

#[derive(Debug)]
struct Group {
    name: Box<str>,
    /// Parent indexes.
    members: Box<[usize]>,
    sticky: Sticky,
    fallback: Fallback,
    /// Connections picked by weight so far (wraps).
    turn: AtomicU64,
}

/// A route's sticky sessions: keyed by what, and for how long by default.
#[derive(Debug, Clone, Copy)]
struct RouteSticky {
    by: StickyBy,
    ttl: Duration,
}

#[derive(Debug)]
struct Route {
    name: Box<str>,
    via: Via,
    egress: Option<egress::Egress>,
    sticky: Option<RouteSticky>,
    /// What it sent through parents, for `/metrics` (kept across a reload by name).
    counters: Arc<crate::telemetry::metrics::PeerCounters>,
}

/// The compiled parents, groups and routes.
#[derive(Debug)]
pub(crate) struct Routes {
    parents: Box<[Arc<Parent>]>,
    groups: Box<[Group]>,
    routes: Box<[Route]>,
    /// The routes' conditions as rules, in route order.
    conditions: RuleSet,
    /// Some route binds to `same`: front ends pass the client's local address.
    same: bool,
    /// The sticky sessions, when a route has `sticky` (None: no request pays for them).
    sessions: Option<Arc<sticky::Table>>,
}

impl Default for Routes {
    fn default() -> Self {
        Routes {
            parents: Box::new([]),
            groups: Box::new([]),
            routes: Box::new([]),
            conditions: RuleSet::compile(&[], true).unwrap_or_else(|_| unreachable!()),
            same: false,
            sessions: None,
        }
    }
}

/// 2^64 / φ: consecutive multiples spread evenly over the u64 range.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Routes {
    /// Compiles the configuration's parents, groups and routes. Their problems are those
    /// `Config::parse` reports with lines (`Config::routing_problems`); `own` are the
    /// addresses the proxy listens on once bound (a parent there would be a loop).
    pub(crate) fn build(cfg: &Config, own: &[SocketAddr]) -> Result<Routes, Vec<String>> {
        let mut problems = cfg.routing_problems();
        for p in &cfg.parents {
            let ips: Vec<IpAddr> = match p.address.host.parse() {
                Ok(ip) => vec![ip],
                Err(_) if p.address.host == "localhost" => {
                    vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]
                }
                Err(_) => Vec::new(),
            };
            let looping = own.iter().find(|&&o| {
                ips.iter().any(|&ip| crate::acl::reaches(SocketAddr::new(ip, p.address.port), o))
            });
            if let Some(o) = looping {
                let message = format!(
                    "parent `{}`: {} is this proxy's own listening address {o}: connections \
                     through it would come back in",
                    p.name, p.address
                );
                if !problems.contains(&message) {
                    problems.push(message);
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let names = crate::config::names_of(&cfg.parents, &cfg.groups);
        // The names were checked above: a lookup that fails is a bug, refused as one.
        let lookup = |name: &str| {
            names.get(name).copied().ok_or_else(|| vec![format!("unknown name `{name}`")])
        };
        let parents = cfg
            .parents
            .iter()
            .enumerate()
            .map(|(index, p)| {
                Arc::new(Parent {
                    index,
                    name: p.name.as_str().into(),
                    kind: p.kind,
                    host: p.address.host.as_str().into(),
                    port: p.address.port,
                    user: p.user.as_deref().map(Into::into),
                    password: p.password.clone(),
                    pass_user: p.pass_user,
                    server_name: p.server_name.as_deref().unwrap_or(&p.address.host).into(),
                    weight: p.weight,
                    max_failures: p.max_failures,
                    down_for: p.down_for,
                    probe: p.probe.clone(),
                    probe_every: p.probe_every,
                    proxy_protocol: p.proxy_protocol,
                    health: Arc::default(),
                })
            })
            .collect();
        let mut groups = Vec::with_capacity(cfg.groups.len());
        for g in &cfg.groups {
            let mut members = Vec::with_capacity(g.parents.len());
            for m in &g.parents {
                match lookup(m)? {
                    Named::Parent(p) => members.push(p),
                    Named::Group(_) => return Err(vec![format!("group member `{m}`")]),
                }
            }
            let fallback = match g.fallback.as_str() {
                crate::config::DENY => Fallback::Deny,
                crate::config::DIRECT => Fallback::Direct,
                name => match lookup(name)? {
                    Named::Parent(p) => Fallback::Parent(p),
                    Named::Group(j) => Fallback::Group(j),
                },
            };
            groups.push(Group {
                name: g.name.as_str().into(),
                members: members.into(),
                sticky: g.sticky,
                fallback,
                turn: AtomicU64::new(0),
            });
        }
        let mut routes = Vec::with_capacity(cfg.routes.len());
        for (i, r) in cfg.routes.iter().enumerate() {
            let via = match r.via.as_slice() {
                [one] if one == crate::config::DIRECT => Via::Direct,
                [one] if one == crate::config::DENY => Via::Deny,
                hops => Via::Hops(
                    hops.iter()
                        .map(|h| {
                            lookup(h).map(|n| match n {
                                Named::Parent(p) => Hop::Parent(p),
                                Named::Group(g) => Hop::Group(g),
                            })
                        })
                        .collect::<Result<_, _>>()?,
                ),
            };
            let name: Box<str> = match &r.name {
                Some(n) => n.as_str().into(),
                None => format!("route {}", i + 1).into(),
            };
            let egress = egress::Egress::build(&r.egress, i, &name).map_err(|e| vec![e])?;
            let sticky = r.sticky.map(|by| RouteSticky {
                by,
                ttl: r.sticky_ttl.unwrap_or(crate::config::DEFAULT_STICKY_TTL),
            });
            routes.push(Route { name, via, egress, sticky, counters: Arc::default() });
        }
        let conditions = cfg.routes.iter().map(|r| (&r.name, &r.conditions));
        let conditions = RuleSet::compile_conditions(conditions).map_err(|errs| {
            errs.into_iter().map(|(i, e)| format!("route {}: {e}", i + 1)).collect::<Vec<_>>()
        })?;
        let sessions = routes.iter().any(|r| r.sticky.is_some()).then(|| {
            Arc::new(sticky::Table::new(
                cfg.limits.max_sticky_sessions,
                cfg.limits.max_sticky_sessions_per_user,
            ))
        });
        let same = routes.iter().any(|r| r.egress.as_ref().is_some_and(egress::Egress::same));
        Ok(Routes {
            parents,
            groups: groups.into(),
            routes: routes.into(),
            conditions,
            same,
            sessions,
        })
    }

    /// The seed of the sticky session a request of `user` with `params` is in on the
    /// route `choose` named `route`, at `now`; None when the route is not sticky, the
    /// request is anonymous, a `session` route gets no session id, or the table is full.
    /// A request on a route without `sticky` costs a test when no route has it, else a
    /// walk over the routes' names.
    pub(crate) fn seed(
        &self,
        route: &str,
        user: Option<&str>,
        params: Option<&Params>,
        now: Instant,
    ) -> Option<u64> {
        let table = self.sessions.as_ref()?;
        let r = self.routes.iter().find(|r| *r.name == *route)?;
        let sticky = r.sticky?;
        let user = user?;
        let session = match sticky.by {
            StickyBy::User => "",
            StickyBy::Session => params?.session.as_deref()?,
        };
        let ttl = params.and_then(|p| p.ttl).unwrap_or(sticky.ttl);
        let (seed, fresh) = table.seed_fresh(&r.name, user, session, ttl, now)?;
        if fresh {
            sticky::share(table, &r.name, user, session, seed, ttl);
        }
        Some(seed)
    }

    /// No routes: every request goes direct, and the direct path needs nothing else.
    pub(crate) fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Whether a route binds to `same`: only then do front ends look up the local address
    /// a client connected to.
    pub(crate) fn needs_local(&self) -> bool {
        self.same
    }

    /// What the host lacks for the routes' outgoing addresses (`Egress::host_problems`).
    pub(crate) fn host_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in self.routes.iter() {
            if let Some(e) = &r.egress {
                out.extend(e.host_problems(&format!("route `{}`", r.name)));
            }
        }
        out
    }

    /// The first route whose conditions all match (those of `acl`, by the same matcher);
    /// with `dest: None` and a route with `destinations` whose other conditions match
    /// first, [`Choice::NeedAddress`]. No allocation.
    pub(crate) fn choose(&self, req: &Request<'_>) -> Choice<'_> {
        match self.conditions.first_match(req) {
            Match::Nothing => Choice::Direct { route: None, egress: None },
            Match::NeedAddress => Choice::NeedAddress,
            Match::Rule(i) => {
                // The conditions are compiled from the routes, one rule per route.
                let route = &self.routes[i];
                let egress = route.egress.as_ref();
                match &route.via {
                    Via::Direct => Choice::Direct { route: Some(&route.name), egress },
                    Via::Deny => Choice::Deny { route: &route.name },
                    Via::Hops(hops) => Choice::Path { route: &route.name, hops, egress },
                }
            }
        }
    }

    /// The parent `hop` (from this table's [`Routes::choose`]) goes through for one
    /// connection of `user` (None: anonymous) from `client`. A lone parent that is down is
    /// refused; a group skips members that are down and falls back when all are (see the
    /// module's notes). No allocation unless refused.
    #[cfg(test)]
    pub(crate) fn pick(
        &self,
        hop: &Hop,
        user: Option<&str>,
        client: IpAddr,
        now: Instant,
    ) -> Pick<'_> {
        self.pick_seeded(hop, user, client, None, now)
    }

    /// [`Routes::pick`] with a sticky session's seed: a group picks by it (see the
    /// module's notes).
    pub(crate) fn pick_seeded(
        &self,
        hop: &Hop,
        user: Option<&str>,
        client: IpAddr,
        seed: Option<u64>,
        now: Instant,
    ) -> Pick<'_> {
        match *hop {
            Hop::Parent(i) => match self.parents.get(i) {
                Some(p) if p.is_up(now) => Pick::Parent(p),
                Some(p) => Pick::Deny(format!("{p} is down")),
                None => Pick::Deny(format!("no parent {i} in this configuration")),
            },
            Hop::Group(g) => self.pick_in_group(g, user, client, seed, now),
        }
    }

    fn pick_in_group(
        &self,
        first: usize,
        user: Option<&str>,
        client: IpAddr,
        seed: Option<u64>,
        now: Instant,
    ) -> Pick<'_> {
        let mut g = first;
        // Fallbacks form no loop (checked); the bound holds even if they did.
        for _ in 0..=self.groups.len() {
            let Some(group) = self.groups.get(g) else { break };
            if let Some(p) = self.member(group, user, client, seed, now) {
                return Pick::Parent(p);
            }
            match group.fallback {
                Fallback::Deny => break,
                Fallback::Direct => return Pick::Direct,
                Fallback::Parent(i) => match self.parents.get(i) {
                    Some(p) if p.is_up(now) => return Pick::Parent(p),
                    _ => break,
                },
                Fallback::Group(next) => g = next,
            }
        }
        Pick::Deny(self.all_down(first))
    }

    /// Why group `first` has no way: every member down, and those of its fallbacks.
    fn all_down(&self, first: usize) -> String {
        use std::fmt::Write as _;
        let mut why = format!("every parent of group `{}` is down", self.group_name(first));
        let mut g = first;
        for _ in 0..self.groups.len() {
            match self.groups.get(g).map(|group| group.fallback) {
                Some(Fallback::Group(next)) => {
                    let name = self.group_name(next);
                    let _ = write!(why, ", and so is every parent of its fallback `{name}`");
                    g = next;
                }
                Some(Fallback::Parent(i)) => {
                    if let Some(p) = self.parents.get(i) {
                        let _ = write!(why, ", and so is its fallback {p}");
                    }
                    break;
                }
                _ => break,
            }
        }
        why
    }

    /// A member of `group` that is up, or None when none is.
    fn member(
        &self,
        group: &Group,
        user: Option<&str>,
        client: IpAddr,
        seed: Option<u64>,
        now: Instant,
    ) -> Option<&Arc<Parent>> {
        let up = || group.members.iter().map(|&i| &self.parents[i]).filter(|p| p.is_up(now));
        let key = match (seed, group.sticky, user) {
            (Some(seed), _, _) => Key::Seed(seed),
            (None, Sticky::None, _) => {
                let total: u64 = up().map(|p| u64::from(p.weight)).sum();
                if total == 0 {
                    return None;
                }
                let turn = group.turn.fetch_add(1, Ordering::Relaxed);
                let spread = turn.wrapping_mul(GOLDEN);
                // Scaled into 0..total without the bias of `%`.
                let mut at = ((u128::from(spread) * u128::from(total)) >> 64) as u64;
                let mut last = None;
                for p in up() {
                    let w = u64::from(p.weight);
                    if at < w {
                        return Some(p);
                    }
                    at -= w;
                    last = Some(p);
                }
                // A member went down between the two walks.
                return last;
            }
            (None, Sticky::User, Some(user)) => Key::User(user),
            (None, Sticky::User | Sticky::Client, _) => Key::Client(crate::acl::canonical(client)),
        };
        up().max_by(|a, b| {
            rendezvous(&key, &a.name, a.weight).total_cmp(&rendezvous(&key, &b.name, b.weight))
        })
    }

    /// Keeps the health of the parents of `old` (the policy before a reload) whose name,
    /// kind and address are unchanged: a parent found down stays down. Routes keep their
    /// counters by name.
    pub(crate) fn keep_health_of(&mut self, old: &Routes) {
        // Sticky sessions go on under the same limit (by route name, user and session).
        if let (Some(new), Some(was)) = (&mut self.sessions, &old.sessions) {
            if new.limits() == was.limits() {
                *new = was.clone();
            }
        }
        for r in self.routes.iter_mut() {
            if let Some(o) = old.routes.iter().find(|o| o.name == r.name) {
                r.counters = o.counters.clone();
            }
        }
        let before: HashMap<&str, &Arc<Parent>> =
            old.parents.iter().map(|p| (&*p.name, p)).collect();
        for p in self.parents.iter_mut() {
            if let Some(o) = before.get(&*p.name) {
                if o.kind == p.kind && o.host == p.host && o.port == p.port {
                    Arc::make_mut(p).health = o.health.clone();
                }
            }
        }
    }

    #[cfg(test)]
    /// Parent `i` ([`Parent::index`], [`Hop::Parent`] of this table). Panics for an index
    /// that is not one of this table's: a caller's bug, never the client's.
    pub(crate) fn parent(&self, i: usize) -> &Arc<Parent> {
        &self.parents[i]
    }

    /// Every parent, in `[[parent]]` order: for health probes and metrics.
    pub(crate) fn parents(&self) -> &[Arc<Parent>] {
        &self.parents
    }

    /// The counters of the route `choose` named `name`.
    pub(crate) fn route_counters(
        &self,
        name: &str,
    ) -> Option<&Arc<crate::telemetry::metrics::PeerCounters>> {
        self.routes.iter().find(|r| *r.name == *name).map(|r| &r.counters)
    }

    /// Every route's name and counters, in `[[route]]` order: for metrics.
    pub(crate) fn route_list(
        &self,
    ) -> impl Iterator<Item = (&str, &crate::telemetry::metrics::PeerCounters)> {
        self.routes.iter().map(|r| (&*r.name, &*r.counters))
    }

    #[cfg(test)]
    /// The route's `name`, or "route N" (1-based); "unknown route" out of range.
    pub(crate) fn route_name(&self, i: usize) -> &str {
        self.routes.get(i).map_or("unknown route", |r| &r.name)
    }

    /// The group's name; "unknown group" out of range.
    pub(crate) fn group_name(&self, i: usize) -> &str {
        self.groups.get(i).map_or("unknown group", |g| &g.name)
    }

    #[cfg(test)]
    /// What a hop is called in errors and logs: the parent's or the group's name.
    pub(crate) fn hop_name(&self, hop: &Hop) -> &str {
        match *hop {
            Hop::Parent(i) => self.parents.get(i).map_or("unknown parent", |p| &p.name),
            Hop::Group(g) => self.group_name(g),
        }
    }
}

/// What a sticky group hashes.
enum Key<'a> {
    User(&'a str),
    Client(IpAddr),
    /// A sticky session's seed.
    Seed(u64),
}

/// FNV-1a over the bytes, then a 64-bit finalizer (the avalanche FNV lacks).
fn hash(key: &Key<'_>, member: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    match key {
        Key::User(u) => {
            eat(b"u");
            eat(u.as_bytes());
        }
        Key::Client(IpAddr::V4(v4)) => {
            eat(b"4");
            eat(&v4.octets());
        }
        Key::Client(IpAddr::V6(v6)) => {
            eat(b"6");
            eat(&v6.octets());
        }
        Key::Seed(seed) => {
            eat(b"s");
            eat(&seed.to_le_bytes());
        }
    }
    eat(&[0xff]);
    eat(member.as_bytes());
    // splitmix64's finalizer.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Weighted rendezvous score: the member with the highest wins, and each wins a share of
/// keys in proportion to its weight (-w / ln u, u uniform in (0, 1)).
fn rendezvous(key: &Key<'_>, member: &str, weight: u32) -> f64 {
    // 53 bits into (0, 1): never 0 (ln 0) nor 1 (ln 1 = 0).
    let u = ((hash(key, member) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight) / u.ln()
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
