//! `[[parent]]`, `[[group]]` and `[[route]]`: other proxies to go through, and which
//! requests go through which. The tables as written and every check on them that needs no
//! I/O, each with the key it is about (the loader turns that into a line); `route::Routes`
//! compiles them.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::duration::duration;
use super::Conditions;
use super::{HostPort, Listener};

/// What a parent proxy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParentKind {
    /// HTTP proxy: CONNECT for tunnels, absolute-form requests for plain HTTP.
    Http,
    /// The same inside TLS, the parent verified (system roots or `ca`, SNI).
    Https,
    /// SOCKS5 (RFC 1928), RFC 1929 credentials, names resolved by the parent.
    Socks5,
    /// SOCKS4a: names resolved by the parent, the user as USERID, no password.
    Socks4a,
}

impl ParentKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ParentKind::Http => "http",
            ParentKind::Https => "https",
            ParentKind::Socks5 => "socks5",
            ParentKind::Socks4a => "socks4a",
        }
    }
}

impl fmt::Display for ParentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A password: its `Debug` prints `***`, and it has no `Display`, so it reaches no log,
/// message or dump by accident. [`Secret::expose`] is the one way to the text.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(Box<str>);

impl Secret {
    pub fn new(text: &str) -> Secret {
        Secret(text.into())
    }

    /// The password itself, for the handshake that sends it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// How a parent's health is probed while it is down (or every `probe_every`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A TCP connection to the parent.
    Tcp,
    /// A tunnel through the parent (CONNECT, or the SOCKS request) to this target.
    Connect(HostPort),
}

impl std::str::FromStr for Probe {
    type Err = String;

    fn from_str(s: &str) -> Result<Probe, String> {
        let bad = || format!("probe `{s}`: use \"tcp\" or \"connect HOST:PORT\"");
        let mut words = s.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("tcp"), None, _) => Ok(Probe::Tcp),
            (Some("connect"), Some(target), None) => {
                target.parse().map(Probe::Connect).map_err(|e| format!("probe `{s}`: {e}"))
            }
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Tcp => f.write_str("tcp"),
            Probe::Connect(target) => write!(f, "connect {target}"),
        }
    }
}

impl<'de> Deserialize<'de> for Probe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How a group picks its member for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sticky {
    /// By weight, connection after connection.
    #[default]
    None,
    /// A hash of the user name (of the client address for anonymous clients): a user
    /// keeps its member while that member is up.
    User,
    /// A hash of the client address.
    Client,
}

/// What a route's sticky sessions are keyed by (`sticky` on `[[route]]`): the same key
/// keeps the same seed, so the same parent of a group and the same outgoing address,
/// for `sticky_ttl` from its first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StickyBy {
    /// The authenticated user (its session ids aside).
    User,
    /// The user and the session id it gives in its user name (`alice-session-x7k2`);
    /// a request without one is not sticky.
    Session,
}

/// How long a route's sticky session lasts when `sticky_ttl` is not given.
pub(crate) const DEFAULT_STICKY_TTL: Duration = Duration::from_secs(600);

/// The names a route or a fallback may give besides parents and groups.
pub const DIRECT: &str = "direct";
pub const DENY: &str = "deny";

/// One `[[parent]]` table.
#[derive(Debug, Clone, Deserialize)]
pub struct ParentConfig {
    /// Unique among parents and groups; neither `direct` nor `deny`.
    pub(crate) name: String,
    pub(crate) kind: ParentKind,
    /// `host:port`; a name is resolved by rustle.
    pub(crate) address: HostPort,
    /// Credentials for the parent: HTTP Basic (`Proxy-Authorization`), SOCKS5 RFC 1929,
    /// SOCKS4a USERID (no password).
    #[serde(default)]
    pub(crate) user: Option<String>,
    #[serde(default)]
    pub(crate) password: Option<Secret>,
    /// Send the client's own authenticated user name instead of `user` (with `password`).
    #[serde(default)]
    pub(crate) pass_user: bool,
    /// `https`: the CAs (PEM) the parent is verified with, instead of the system's.
    #[serde(default)]
    pub(crate) ca: Option<PathBuf>,
    /// `https`: the name sent (SNI) and verified; the host of `address` by default.
    #[serde(default)]
    pub(crate) server_name: Option<String>,
    /// Its share within a group (at least 1).
    #[serde(default = "default_weight")]
    pub(crate) weight: u32,
    /// Consecutive failures that mark it down; 0: never marked down.
    #[serde(default = "default_max_failures")]
    pub(crate) max_failures: u32,
    /// How long it stays down before it is tried again.
    #[serde(default = "default_down_for", deserialize_with = "duration")]
    pub(crate) down_for: Duration,
    #[serde(default)]
    pub(crate) probe: Option<Probe>,
    #[serde(default = "default_probe_every", deserialize_with = "duration")]
    pub(crate) probe_every: Duration,
    /// `v1` | `v2`: a PROXY protocol header first on each new connection to it (before
    /// its TLS or proxy handshake), naming the client and the listener's address.
    /// Connections to it are never pooled: each stays with the client connection that
    /// made it (`exchange::Pinned`).
    #[serde(default)]
    pub(crate) proxy_protocol: Option<super::ProxyProtocol>,
}

fn default_weight() -> u32 {
    1
}

fn default_max_failures() -> u32 {
    3
}

fn default_down_for() -> Duration {
    Duration::from_secs(30)
}

fn default_probe_every() -> Duration {
    Duration::from_secs(10)
}

/// One `[[group]]` table.
#[derive(Debug, Clone, Deserialize)]
pub struct GroupConfig {
    /// Unique among parents and groups; neither `direct` nor `deny`.
    pub(crate) name: String,
    /// Parent names (not groups), at least one.
    pub(crate) parents: Vec<String>,
    #[serde(default)]
    pub(crate) sticky: Sticky,
    /// `deny`, `direct`, or another group or a parent: used when every member is down.
    #[serde(default = "default_fallback")]
    pub(crate) fallback: String,
}

fn default_fallback() -> String {
    DENY.into()
}

/// One `[[route]]` table: the conditions of a `[[rule]]` (checked and matched by the
/// same code), and where matching requests go.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// For logs; default "route N" (1-based).
    pub(crate) name: Option<String>,
    pub(crate) conditions: Conditions,
    /// `direct`, `deny`, a parent, a group, or a chain of parents and groups (first hop
    /// first). Written as a string or a list of strings.
    pub(crate) via: Vec<String>,
    /// Where its connections leave from (`bind`, `bind_pick`, `interface`).
    pub(crate) egress: super::EgressConfig,
    /// Sticky sessions on this route, by user or by user and session id.
    pub(crate) sticky: Option<StickyBy>,
    /// How long a sticky session lasts from its first use (a client's `ttl` parameter
    /// overrides it, up to `auth.params.max_ttl`).
    pub(crate) sticky_ttl: Option<Duration>,
}

impl<'de> Deserialize<'de> for RouteConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// `via`: a name or a list of names.
        struct Via(Vec<String>);
        impl<'de> Deserialize<'de> for Via {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                names(d).map(Via)
            }
        }
        /// `sticky_ttl`: a duration as every other in the file.
        #[derive(Deserialize)]
        #[serde(transparent)]
        struct Ttl(#[serde(deserialize_with = "duration")] Duration);
        struct Route;
        impl<'de> serde::de::Visitor<'de> for Route {
            type Value = RouteConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a [[route]] table")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RouteConfig, A::Error> {
                let (mut name, mut via, mut conditions) = (None, None, Conditions::default());
                let mut egress = super::EgressConfig::default();
                let (mut sticky, mut sticky_ttl) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => name = Some(map.next_value()?),
                        "via" => via = Some(map.next_value::<Via>()?.0),
                        "bind" => egress.bind = map.next_value::<Via>()?.0,
                        "bind_pick" => egress.pick = Some(map.next_value()?),
                        "interface" => egress.interface = Some(map.next_value()?),
                        "sticky" => sticky = Some(map.next_value()?),
                        "sticky_ttl" => sticky_ttl = Some(map.next_value::<Ttl>()?.0),
                        k if conditions.take(k, &mut map)? => {}
                        // Read as ignored, so that serde_ignored reports it.
                        _ => _ = map.next_value::<serde::de::IgnoredAny>()?,
                    }
                }
                let via = via.ok_or_else(|| serde::de::Error::missing_field("via"))?;
                Ok(RouteConfig { name, conditions, via, egress, sticky, sticky_ttl })
            }
        }
        d.deserialize_map(Route)
    }
}

impl RouteConfig {
    /// "route `NAME`", or "route N" (1-based) without a name.
    pub(crate) fn label(&self, index: usize) -> String {
        match &self.name {
            Some(name) => format!("route `{name}`"),
            None => format!("route {}", index + 1),
        }
    }
}

/// A name or a list of names.
fn names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Names;
    impl<'de> serde::de::Visitor<'de> for Names {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a name or a list of names")
        }

        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Vec<String>, E> {
            Ok(vec![s.to_string()])
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Vec<String>, A::Error> {
            let mut out = Vec::new();
            while let Some(name) = seq.next_element::<String>()? {
                out.push(name);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Names)
}

/// What a name stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Parent(usize),
    Group(usize),
}

/// Parents and groups by name (the first of each name; `direct` and `deny` are never
/// theirs).
pub fn names_of<'a>(
    parents: &'a [ParentConfig],
    groups: &'a [GroupConfig],
) -> HashMap<&'a str, Named> {
    let parents = parents.iter().enumerate().map(|(i, p)| (p.name.as_str(), Named::Parent(i)));
    let groups = groups.iter().enumerate().map(|(i, g)| (g.name.as_str(), Named::Group(i)));
    let mut map = HashMap::new();
    for (name, named) in parents.chain(groups).filter(|(n, _)| *n != DIRECT && *n != DENY) {
        map.entry(name).or_insert(named);
    }
    map
}

/// A problem and the key it is about: `["parent", "0", "weight"]`.
pub(super) type Located = (Vec<String>, String);

fn at(table: &str, index: usize, key: &str) -> Vec<String> {
    let mut segs = vec![table.to_string(), index.to_string()];
    if !key.is_empty() {
        segs.push(key.to_string());
    }
    segs
}

/// Every problem of the parents, groups and routes; `listeners` are the proxy's own (a
/// parent at one of their addresses would be a loop).
pub(super) fn problems(
    parents: &[ParentConfig],
    groups: &[GroupConfig],
    routes: &[RouteConfig],
    listeners: &[Listener],
) -> Vec<Located> {
    let mut out = Vec::new();
    let names = names_of(parents, groups);
    let tables = parents
        .iter()
        .enumerate()
        .map(|(i, p)| ("parent", i, p.name.as_str()))
        .chain(groups.iter().enumerate().map(|(i, g)| ("group", i, g.name.as_str())));
    let mut seen: HashMap<&str, String> = HashMap::new();
    for (table, index, name) in tables {
        let this = format!("{table} {}", index + 1);
        let message = if name.trim().is_empty() {
            format!("{this}: an empty name")
        } else if name == DIRECT || name == DENY {
            format!("{this}: `{name}` is a reserved name (routes and fallbacks use it)")
        } else if let Some(first) = seen.get(name) {
            format!("{this}: the name `{name}` is already taken by {first}")
        } else {
            seen.insert(name, this);
            continue;
        };
        out.push((at(table, index, "name"), message));
    }
    for (i, p) in parents.iter().enumerate() {
        out.extend(parent_problems(p, listeners).into_iter().map(|(key, message)| {
            (at("parent", i, key), format!("parent `{}`: {message}", p.name))
        }));
    }
    for (i, g) in groups.iter().enumerate() {
        let this = format!("group `{}`", g.name);
        if g.parents.is_empty() {
            out.push((
                at("group", i, "parents"),
                format!("{this}: a group needs at least one parent"),
            ));
        }
        for (k, member) in g.parents.iter().enumerate() {
            let problem = match names.get(member.as_str()) {
                Some(Named::Parent(_)) if g.parents[..k].contains(member) => {
                    format!("lists `{member}` twice")
                }
                Some(Named::Parent(_)) => continue,
                Some(Named::Group(_)) => {
                    format!("`{member}` is a group: the members of a group are parents")
                }
                None => format!("names no parent `{member}`"),
            };
            out.push((at("group", i, "parents"), format!("{this}: {problem}")));
        }
        if g.fallback != DIRECT && g.fallback != DENY && !names.contains_key(g.fallback.as_str()) {
            out.push((
                at("group", i, "fallback"),
                format!(
                    "{this}: fallback `{}` is no parent or group (nor `direct` or `deny`)",
                    g.fallback
                ),
            ));
        }
        if let Some(cycle) = fallback_cycle(groups, &names, i) {
            out.push((at("group", i, "fallback"), format!("{this}: the fallbacks loop: {cycle}")));
        }
    }
    for (i, r) in routes.iter().enumerate() {
        let this = r.label(i);
        let deny = matches!(r.via.as_slice(), [one] if one == DENY);
        for (key, message) in super::egress::problems(&r.egress, deny) {
            out.push((at("route", i, key), format!("{this}: {message}")));
        }
        let via_at = || at("route", i, "via");
        match r.via.as_slice() {
            [] => out.push((via_at(), format!("{this}: `via = []` goes nowhere: name `direct`, `deny`, a parent, a group or a chain"))),
            [one] if one == DIRECT || one == DENY => {}
            hops => {
                let mut known = true;
                for hop in hops {
                    if hop == DIRECT || hop == DENY {
                        known = false;
                        out.push((
                            via_at(),
                            format!("{this}: `{hop}` stands alone, not in a chain"),
                        ));
                    } else if !names.contains_key(hop.as_str()) {
                        known = false;
                        out.push((via_at(), format!("{this}: names no parent or group `{hop}`")));
                    }
                }
                if known {
                    if let Some(message) = chain_loop(hops, parents, groups, &names) {
                        out.push((via_at(), format!("{this}: {message}")));
                    }
                }
            }
        }
    }
    for (i, r) in routes.iter().enumerate() {
        let this = r.label(i);
        if r.sticky_ttl.is_some() && r.sticky.is_none() {
            out.push((
                at("route", i, "sticky_ttl"),
                format!("{this}: `sticky_ttl` needs `sticky = \"user\"` or `\"session\"`"),
            ));
        }
        if r.sticky_ttl.is_some_and(|t| t.is_zero()) {
            out.push((
                at("route", i, "sticky_ttl"),
                format!("{this}: `sticky_ttl` must not be zero"),
            ));
        }
        if r.sticky.is_some() && r.via.len() == 1 && r.via[0] == DENY {
            out.push((
                at("route", i, "sticky"),
                format!("{this}: a `deny` route has nothing to stick to"),
            ));
        }
    }
    let conditions = routes.iter().map(|r| (&r.name, &r.conditions));
    if let Err(errs) = crate::acl::RuleSet::compile_conditions(conditions) {
        for (i, e) in errs {
            out.push((at("route", i, ""), format!("{}: {e}", routes[i].label(i))));
        }
    }
    out
}

/// Problems of one parent alone: (key, message).
fn parent_problems(p: &ParentConfig, listeners: &[Listener]) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let https = p.kind == ParentKind::Https;
    if !https {
        for (key, set) in [("ca", p.ca.is_some()), ("server_name", p.server_name.is_some())] {
            if set {
                out.push((key, format!("`{key}` is for https parents, not {}", p.kind)));
            }
        }
    }
    if https {
        let (key, name) = match &p.server_name {
            Some(name) => ("server_name", name.as_str()),
            None => ("address", p.address.host.as_str()),
        };
        if rustls::pki_types::ServerName::try_from(name).is_err() {
            out.push((key, format!("`{name}` is not a server name to verify")));
        }
    }
    if p.proxy_protocol == Some(super::ProxyProtocol::Any) {
        out.push(("proxy_protocol", "sends one version: \"v1\" or \"v2\"".to_string()));
    }
    if let Some(user) = &p.user {
        if user.is_empty() {
            out.push(("user", "an empty user name".to_string()));
        }
        if matches!(p.kind, ParentKind::Http | ParentKind::Https) && user.contains(':') {
            out.push(("user", "an HTTP Basic user name cannot hold `:`".to_string()));
        }
        if p.kind == ParentKind::Socks5 && user.len() > 255 {
            out.push(("user", "a SOCKS5 user name is at most 255 bytes".to_string()));
        }
        if p.kind == ParentKind::Socks4a && user.contains('\0') {
            out.push(("user", "a SOCKS4a user id cannot hold a NUL byte".to_string()));
        }
    }
    if let Some(password) = &p.password {
        if p.kind == ParentKind::Socks4a {
            out.push(("password", "socks4a carries no password".to_string()));
        } else if p.user.is_none() && !p.pass_user {
            out.push(("password", "a password needs `user` (or `pass_user = true`)".to_string()));
        }
        if p.kind == ParentKind::Socks5 && password.expose().len() > 255 {
            out.push(("password", "a SOCKS5 password is at most 255 bytes".to_string()));
        }
    }
    if p.weight == 0 {
        out.push(("weight", "weight 0 would never be picked: at least 1".to_string()));
    }
    if p.down_for.is_zero() {
        out.push((
            "down_for",
            "`down_for` must not be zero (`max_failures = 0` never marks a parent down)"
                .to_string(),
        ));
    }
    if p.probe_every.is_zero() {
        out.push(("probe_every", "`probe_every` must not be zero".to_string()));
    }
    if let Some(own) =
        super::checks::own_listener(listeners, &p.address.host, p.address.port, false)
    {
        out.push(("address", own_message(p, own)));
    }
    out
}

/// A parent at one of the proxy's own listening addresses: every connection through it
/// would come back in.
pub(super) fn loop_problem(p: &ParentConfig, listeners: &[Listener]) -> Option<String> {
    let own = super::checks::own_listener(listeners, &p.address.host, p.address.port, false)?;
    Some(format!("parent `{}`: {}", p.name, own_message(p, own)))
}

fn own_message(p: &ParentConfig, own: &Listener) -> String {
    format!(
        "{} is this proxy's own listener {} ({}): connections through it would come back in",
        p.address, own.listen, own.kind
    )
}

/// The group a fallback names, if it names one.
fn fallback_group(g: &GroupConfig, names: &HashMap<&str, Named>) -> Option<usize> {
    match names.get(g.fallback.as_str()) {
        Some(Named::Group(j)) => Some(*j),
        _ => None,
    }
}

/// `a → b → a` when group `start` is on a loop of fallbacks (reported by the loop's first
/// group only).
fn fallback_cycle(
    groups: &[GroupConfig],
    names: &HashMap<&str, Named>,
    start: usize,
) -> Option<String> {
    let mut path = vec![start];
    let mut cur = start;
    while let Some(next) = fallback_group(&groups[cur], names) {
        if next == start {
            if path.iter().any(|&g| g < start) {
                return None;
            }
            path.push(start);
            let shown: Vec<&str> = path.iter().map(|&g| groups[g].name.as_str()).collect();
            return Some(shown.join(" → "));
        }
        if path.contains(&next) {
            return None;
        }
        path.push(next);
        cur = next;
    }
    None
}

/// The parents a hop may use: itself, or a group's members and those of its fallbacks.
fn reachable(named: Named, groups: &[GroupConfig], names: &HashMap<&str, Named>) -> Vec<usize> {
    let mut out = Vec::new();
    let mut next = Some(named);
    let mut visited = Vec::new();
    while let Some(n) = next.take() {
        match n {
            Named::Parent(p) => out.push(p),
            Named::Group(g) if !visited.contains(&g) => {
                visited.push(g);
                out.extend(groups[g].parents.iter().filter_map(|m| match names.get(m.as_str()) {
                    Some(Named::Parent(p)) => Some(*p),
                    _ => None,
                }));
                next = names.get(groups[g].fallback.as_str()).copied();
            }
            Named::Group(_) => {}
        }
    }
    out
}

/// A chain whose hops may use the same parent twice would go through it twice: a loop.
fn chain_loop(
    hops: &[String],
    parents: &[ParentConfig],
    groups: &[GroupConfig],
    names: &HashMap<&str, Named>,
) -> Option<String> {
    let sets: Vec<Vec<usize>> = hops
        .iter()
        .filter_map(|h| names.get(h.as_str()))
        .map(|&n| reachable(n, groups, names))
        .collect();
    for (a, first) in sets.iter().enumerate() {
        for (b, second) in sets.iter().enumerate().skip(a + 1) {
            if let Some(p) = first.iter().find(|p| second.contains(p)) {
                let name = &parents[*p].name;
                return Some(if hops[a] == hops[b] {
                    format!("the chain goes through `{}` twice", hops[a])
                } else {
                    format!(
                        "the chain may go through parent `{name}` twice (hops `{}` and `{}`)",
                        hops[a], hops[b]
                    )
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
