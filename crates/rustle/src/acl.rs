//! Access rules: `[[rule]]` tables compiled into a [`RuleSet`], checked once per request
//! (first match wins), and the built-in destination protections ([`Builtins`]).
//!
//! Order for one request: [`RuleSet::check`] with `dest: None` before resolving (it may
//! already decide, or answer [`Verdict::NeedAddress`]); then, for each candidate address,
//! [`Builtins::check`] and [`RuleSet::check`] with `dest: Some(ip)`.
//!
//! Nothing here allocates while checking; compiling does all the parsing. Pure (the host's
//! addresses aside, `local`), and below `config`, which embeds its tables and compiles
//! them in its checks.

pub mod local;
mod net;

use std::net::IpAddr;

use serde::Deserialize;

mod conditions;
mod params;
pub(crate) use conditions::{Conditions, RuleConfig};
pub(crate) use params::Params;

pub use net::{
    canonical, is_private, private_reason, reaches, Builtins, Cidr, LOCAL_REASON, LOOP_REASON,
};

pub(crate) use crate::protocol::Protocol;

/// A protocol's bit in a rule's `protocols` set.
fn bit(p: Protocol) -> u8 {
    1 << (p as u8)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Action {
    Allow,
    Deny,
}

/// `line N: rule K: group ...` for each group a rule names that `defined` does not know: a
/// misspelt group would make its rule match nobody, silently. Checked once the users are
/// loaded (groups come from users files as well as from the configuration). `what` names
/// the table: "rule", or "route" for the routes' conditions.
pub(crate) fn undefined_groups<'a>(
    rules: impl IntoIterator<Item = &'a Conditions>,
    what: &str,
    defined: impl Fn(&str) -> bool,
) -> Vec<String> {
    undefined(
        rules,
        |r| (&r.groups, r.groups_line),
        |g| !defined(g),
        |i, group| {
            format!(
                "{what} {i}: group `{group}` is not defined: no user is in it (give it to a user, \
             or declare it in [auth.groups], even empty)"
            )
        },
    )
}

/// `line N: rule K: user ...` for each user a rule names that `defined` does not know
/// (`*`, any authenticated user, aside): a misspelt user would make its rule match nobody.
pub(crate) fn undefined_users<'a>(
    rules: impl IntoIterator<Item = &'a Conditions>,
    what: &str,
    defined: impl Fn(&str) -> bool,
) -> Vec<String> {
    undefined(
        rules,
        |r| (&r.users, r.users_line),
        |u| u != "*" && !defined(u),
        |i, user| format!("{what} {i}: user `{user}` is not defined (in [auth] or the users file)"),
    )
}

/// The names a rule's list (`field`: the list and its line) holds that `unknown` picks,
/// each said by `say(rule number, name)` after its line.
fn undefined<'a>(
    rules: impl IntoIterator<Item = &'a Conditions>,
    field: impl Fn(&'a Conditions) -> (&'a Option<Vec<String>>, Option<usize>),
    unknown: impl Fn(&str) -> bool,
    say: impl Fn(usize, &str) -> String,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, rule) in rules.into_iter().enumerate() {
        let (names, line) = field(rule);
        for name in names.iter().flatten().filter(|n| unknown(n)) {
            let at = line.map(|n| format!("line {n}: ")).unwrap_or_default();
            problems.push(format!("{at}{}", say(i + 1, name)));
        }
    }
    problems
}

/// Compiles rules (a name, an action, none for a route's: allow; conditions), reporting
/// every problem of every rule: (index, message).
fn compile<'a>(
    rules: impl Iterator<Item = (&'a Option<String>, Option<&'a str>, &'a Conditions)>,
    default_allow: bool,
) -> Result<RuleSet, Vec<(usize, String)>> {
    let mut problems = Vec::new();
    let mut compiled = Vec::with_capacity(rules.size_hint().0);
    for (i, (name, action, r)) in rules.enumerate() {
        let p = &mut problems;
        let name = match name {
            Some(n) if n.trim().is_empty() => {
                p.push((i, "`name` is empty".to_string()));
                n.as_str().into()
            }
            Some(n) => n.as_str().into(),
            None => format!("rule {}", i + 1).into(),
        };
        let action = match action.unwrap_or("allow") {
            "allow" => Action::Allow,
            "deny" => Action::Deny,
            other => {
                p.push((i, format!("`action` must be \"allow\" or \"deny\", not {other:?}")));
                Action::Deny
            }
        };
        let users = compile_list(i, "users", "user", &r.users, p, |s| match s {
            "*" => Ok(None),
            s => non_empty(s).map(Some),
        })
        .map(|list| Users {
            any: list.iter().any(Option::is_none),
            names: list.into_vec().into_iter().flatten().collect(),
        });
        let protocols =
            compile_list(i, "protocols", "protocol", &r.protocols, p, |s| s.parse::<Protocol>())
                .map(|list| list.iter().fold(0u8, |bits, p| bits | bit(*p)));
        compiled.push(Rule {
            name,
            action,
            listeners: compile_list(i, "listeners", "listener", &r.listeners, p, non_empty),
            clients: compile_list(i, "clients", "client", &r.clients, p, |s| s.parse()),
            users,
            groups: compile_list(i, "groups", "group", &r.groups, p, non_empty),
            hosts: compile_list(i, "hosts", "host", &r.hosts, p, HostPattern::parse),
            destinations: compile_list(i, "destinations", "destination", &r.destinations, p, |s| {
                s.parse()
            }),
            ports: compile_list(i, "ports", "port", &r.ports, p, parse_port_range),
            params: compile_list(i, "params", "parameter", &r.params, p, params::parse_condition),
            protocols,
        });
    }
    if problems.is_empty() {
        Ok(RuleSet { rules: compiled.into_boxed_slice(), default_allow })
    } else {
        Err(problems)
    }
}

/// What is known about a request when it is checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// The listener's name, if it has one.
    pub(crate) listener: Option<&'a str>,
    /// The client's address (IPv4-mapped IPv6 counts as IPv4).
    pub(crate) client: IpAddr,
    /// The authenticated user, None for anonymous clients.
    pub(crate) user: Option<&'a str>,
    /// The user's groups.
    pub(crate) groups: &'a [String],
    /// The destination host as the client named it (any case; a trailing dot and IPv6
    /// brackets are ignored).
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) protocol: Protocol,
    /// The address about to be connected to; None before resolution.
    pub(crate) dest: Option<IpAddr>,
    /// The parameters of the user name (`[auth.params]`), if it had any.
    pub(crate) params: Option<&'a Params>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allow,
    Deny {
        /// Index of the deciding rule, for [`RuleSet::rule_name`]; None when the default
        /// decided (or, for the caller's own use, a built-in protection).
        rule: Option<usize>,
        reason: &'static str,
    },
    /// Cannot decide before the destination address is known: a rule with `destinations`
    /// whose other conditions match comes before any rule that decides. Resolve, then check
    /// again with `dest` set, once per candidate address.
    NeedAddress,
}

/// What [`RuleSet::first_match`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Match {
    /// The index of the first rule that matches.
    Rule(usize),
    /// No rule matches.
    Nothing,
    /// A rule with `destinations` whose other conditions match comes first, and the
    /// destination address is not known yet (as [`Verdict::NeedAddress`]).
    NeedAddress,
}

/// The reason of a [`Verdict::Deny`] from a deny rule.
pub(crate) const RULE_REASON: &str = "denied by rule";
/// The reason of a [`Verdict::Deny`] when no rule matched and the default is deny.
pub(crate) const DEFAULT_REASON: &str = "no rule allows it";

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    /// Lowercase, without a trailing dot or brackets.
    Exact(Box<str>),
    /// Lowercase, with its leading dot: `.example.org`.
    Suffix(Box<str>),
}

/// A trailing dot (fully qualified) and IPv6 brackets do not change the host.
fn bare_host(h: &str) -> &str {
    let h = h.strip_suffix('.').unwrap_or(h);
    match h.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        Some(v6) => v6,
        None => h,
    }
}

impl HostPattern {
    fn parse(s: &str) -> Result<HostPattern, String> {
        if s == "*" {
            return Ok(HostPattern::Any);
        }
        let bad = |why: &str| format!("host pattern `{s}`: {why}");
        let (suffix, rest) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let rest = bare_host(rest);
        if rest.is_empty() || rest.starts_with('.') || rest.contains("..") {
            return Err(bad("empty name or label"));
        }
        if rest.contains('*') {
            return Err(bad("`*` may only be the whole pattern or lead `*.suffix`"));
        }
        if rest.bytes().any(|b| b.is_ascii_whitespace() || b == b'/') {
            return Err(bad("a host name, not a URL"));
        }
        if rest.contains(':') && rest.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("a host name without a port (use `ports`)"));
        }
        let lower = rest.to_ascii_lowercase();
        if suffix {
            Ok(HostPattern::Suffix(format!(".{lower}").into()))
        } else {
            Ok(HostPattern::Exact(lower.into()))
        }
    }

    #[inline]
    fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(name) => host.eq_ignore_ascii_case(name),
            HostPattern::Suffix(suffix) => {
                let (h, s) = (host.as_bytes(), suffix.as_bytes());
                h.len() > s.len() && h[h.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

fn parse_port(s: &str) -> Option<u16> {
    // Digits only: u16's parser would take `+80`.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&p| p != 0)
}

fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad = |why: &str| format!("port `{s}`: {why}");
    let (lo, hi) = match s.split_once('-') {
        Some((lo, hi)) => (lo, hi),
        None => (s, s),
    };
    let lo = parse_port(lo).ok_or_else(|| bad("ports are 1 to 65535"))?;
    let hi = parse_port(hi).ok_or_else(|| bad("ports are 1 to 65535"))?;
    if lo > hi {
        return Err(bad("a range goes from low to high"));
    }
    Ok((lo, hi))
}

#[derive(Debug, Clone)]
struct Users {
    /// `*`: any authenticated user.
    any: bool,
    names: Box<[Box<str>]>,
}

#[derive(Debug, Clone)]
struct Rule {
    name: Box<str>,
    action: Action,
    listeners: Option<Box<[Box<str>]>>,
    clients: Option<Box<[Cidr]>>,
    users: Option<Users>,
    groups: Option<Box<[Box<str>]>>,
    hosts: Option<Box<[HostPattern]>>,
    destinations: Option<Box<[Cidr]>>,
    ports: Option<Box<[(u16, u16)]>>,
    /// User-name parameters, `(name, value)`: any of them.
    params: Option<Box<[params::Pair]>>,
    /// Bits of [`bit`].
    protocols: Option<u8>,
}

impl Rule {
    /// Every condition but `destinations`, cheapest first.
    #[inline]
    fn matches_before_dest(&self, req: &Request<'_>) -> bool {
        if let Some(bits) = self.protocols {
            if bits & bit(req.protocol) == 0 {
                return false;
            }
        }
        if let Some(ports) = &self.ports {
            if !ports.iter().any(|&(lo, hi)| (lo..=hi).contains(&req.port)) {
                return false;
            }
        }
        if let Some(names) = &self.listeners {
            match req.listener {
                Some(l) if names.iter().any(|n| **n == *l) => {}
                _ => return false,
            }
        }
        if let Some(blocks) = &self.clients {
            if !blocks.iter().any(|b| b.contains(req.client)) {
                return false;
            }
        }
        if let Some(users) = &self.users {
            match req.user {
                Some(u) if users.any || users.names.iter().any(|n| **n == *u) => {}
                _ => return false,
            }
        }
        if let Some(groups) = &self.groups {
            if !req.groups.iter().any(|g| groups.iter().any(|n| **n == **g)) {
                return false;
            }
        }
        if let Some(hosts) = &self.hosts {
            let host = bare_host(req.host);
            if !hosts.iter().any(|p| p.matches(host)) {
                return false;
            }
        }
        if let Some(wanted) = &self.params {
            if !params::matches(wanted, req.params) {
                return false;
            }
        }
        true
    }
}

/// A compiled rule set.
#[derive(Debug, Clone)]
pub(crate) struct RuleSet {
    rules: Box<[Rule]>,
    default_allow: bool,
}

/// Parses every element of an optional list, reporting each bad one (and an empty list).
fn compile_list<T>(
    index: usize,
    key: &str,
    what: &str,
    list: &Option<Vec<String>>,
    problems: &mut Vec<(usize, String)>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Option<Box<[T]>> {
    let list = list.as_ref()?;
    if list.is_empty() {
        problems.push((
            index,
            format!("`{key} = []` matches nothing: leave `{key}` out to match any {what}"),
        ));
        return None;
    }
    let mut out = Vec::with_capacity(list.len());
    for s in list {
        match parse(s) {
            Ok(v) => out.push(v),
            Err(e) => problems.push((index, format!("`{key}`: {e}"))),
        }
    }
    Some(out.into_boxed_slice())
}

fn non_empty(s: &str) -> Result<Box<str>, String> {
    if s.is_empty() {
        Err("an empty name".to_string())
    } else {
        Ok(s.into())
    }
}

/// Whether the blocks of one family cover all of its addresses.
fn covers_family(blocks: &[Cidr], v6: bool) -> bool {
    let mut ranges: Vec<(u128, u128)> = blocks
        .iter()
        .filter_map(|b| match *b {
            Cidr::V4 { net, prefix } if !v6 => {
                let size = 1u128 << (32 - prefix);
                Some((u128::from(net), u128::from(net) + (size - 1)))
            }
            Cidr::V6 { net, prefix } if v6 => {
                let host = u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
                Some((net, net | host))
            }
            _ => None,
        })
        .collect();
    ranges.sort_unstable();
    let max = if v6 { u128::MAX } else { u128::from(u32::MAX) };
    // The first address not yet covered.
    let mut next = 0u128;
    for (start, end) in ranges {
        if start > next {
            return false;
        }
        if end >= next {
            match end.checked_add(1) {
                Some(n) => next = n,
                None => return true,
            }
        }
    }
    next > max
}

fn covers_everything(blocks: &[Cidr]) -> bool {
    covers_family(blocks, false) && covers_family(blocks, true)
}

impl RuleSet {
    /// Compiles configs; every problem (bad CIDR, bad port or range, unknown protocol,
    /// empty list, bad host pattern, empty name) comes with the index of its rule
    /// (0-based), so the config loader can turn it into a line.
    pub(crate) fn compile(
        rules: &[RuleConfig],
        default_allow: bool,
    ) -> Result<RuleSet, Vec<(usize, String)>> {
        let rules = rules.iter().map(|r| (&r.name, Some(r.action.as_str()), &r.conditions));
        compile(rules, default_allow)
    }

    /// The routes' conditions (`[[route]]`: a name and conditions) as a set of allow
    /// rules, one per route in order, for [`RuleSet::first_match`].
    pub(crate) fn compile_conditions<'a>(
        routes: impl Iterator<Item = (&'a Option<String>, &'a Conditions)>,
    ) -> Result<RuleSet, Vec<(usize, String)>> {
        compile(routes.map(|(name, c)| (name, None, c)), true)
    }

    /// First match wins; with no match, the default. With `dest: None`, a rule with
    /// `destinations` whose other conditions match gives [`Verdict::NeedAddress`]. No
    /// allocation.
    pub(crate) fn check(&self, req: &Request<'_>) -> Verdict {
        match self.first_match(req) {
            Match::Rule(i) => match self.rules[i].action {
                Action::Allow => Verdict::Allow,
                Action::Deny => Verdict::Deny { rule: Some(i), reason: RULE_REASON },
            },
            Match::NeedAddress => Verdict::NeedAddress,
            Match::Nothing if self.default_allow => Verdict::Allow,
            Match::Nothing => Verdict::Deny { rule: None, reason: DEFAULT_REASON },
        }
    }

    /// The first rule whose conditions all match, whatever its action: the matcher that
    /// [`RuleSet::check`] and the routes (`route::Routes::choose`) share. No allocation.
    #[inline]
    pub(crate) fn first_match(&self, req: &Request<'_>) -> Match {
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.matches_before_dest(req) {
                continue;
            }
            if let Some(blocks) = &rule.destinations {
                match req.dest {
                    None => return Match::NeedAddress,
                    Some(ip) if !blocks.iter().any(|b| b.contains(ip)) => continue,
                    Some(_) => {}
                }
            }
            return Match::Rule(i);
        }
        Match::Nothing
    }

    /// The rule's `name`, or "rule N" (1-based) without one; "unknown rule" for an index
    /// out of range.
    pub(crate) fn rule_name(&self, index: usize) -> &str {
        self.rules.get(index).map_or("unknown rule", |r| &r.name)
    }

    pub(crate) fn len(&self) -> usize {
        self.rules.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub(crate) fn default_allow(&self) -> bool {
        self.default_allow
    }

    /// For the open-proxy check: whether a stranger (an anonymous client whose address is
    /// in no `clients` list) is refused everything, on any listener. Conservative: when
    /// unsure, false. See [`RuleSet::restricts_clients_on`].
    pub(crate) fn restricts_clients(&self) -> bool {
        self.closed_to_strangers(None)
    }

    /// [`RuleSet::restricts_clients`] for a client of the listener named `listener`.
    ///
    /// Walks the rules as a stranger would meet them: rules needing `users` or `groups`
    /// never match; an allow rule with `clients` is taken not to match (unless the
    /// `clients` of the allow rules together cover all of IPv4 or all of IPv6); any other
    /// allow rule that may apply means the proxy is open to someone (even if only for
    /// some hosts or ports); a deny rule closes it only if it surely matches every request
    /// (its conditions are absent or cover everything). At the end, the default decides.
    pub(crate) fn restricts_clients_on(&self, listener: &str) -> bool {
        self.closed_to_strangers(Some(listener))
    }

    fn closed_to_strangers(&self, listener: Option<&str>) -> bool {
        let allow_blocks: Vec<Cidr> = self
            .rules
            .iter()
            .filter(|r| r.action == Action::Allow)
            .flat_map(|r| r.clients.iter().flat_map(|c| c.iter().copied()))
            .collect();
        let allow_blocks_cover_a_family =
            covers_family(&allow_blocks, false) || covers_family(&allow_blocks, true);
        for rule in self.rules.iter() {
            if rule.users.is_some() || rule.groups.is_some() || rule.params.is_some() {
                continue;
            }
            let surely_this_listener = match (&rule.listeners, listener) {
                (None, _) => true,
                (Some(names), Some(l)) if names.iter().any(|n| **n == *l) => true,
                (Some(_), Some(_)) => continue,
                (Some(_), None) => false,
            };
            match rule.action {
                Action::Allow => {
                    if rule.clients.is_some() && !allow_blocks_cover_a_family {
                        continue;
                    }
                    return false;
                }
                Action::Deny => {
                    let all_hosts =
                        rule.hosts.as_ref().is_none_or(|h| h.contains(&HostPattern::Any));
                    let all_ports = rule.ports.as_ref().is_none_or(|ports| {
                        let mut sorted = ports.to_vec();
                        sorted.sort_unstable();
                        let mut next = 1u32;
                        for (lo, hi) in sorted {
                            if u32::from(lo) > next {
                                break;
                            }
                            next = next.max(u32::from(hi) + 1);
                        }
                        next > u32::from(u16::MAX)
                    });
                    let all_protocols = rule
                        .protocols
                        .is_none_or(|bits| Protocol::ALL.iter().all(|p| bits & bit(*p) != 0));
                    if surely_this_listener
                        && rule.clients.as_deref().is_none_or(covers_everything)
                        && rule.destinations.as_deref().is_none_or(covers_everything)
                        && all_hosts
                        && all_ports
                        && all_protocols
                    {
                        return true;
                    }
                }
            }
        }
        !self.default_allow
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        rule: Vec<RuleConfig>,
    }

    fn configs(text: &str) -> Vec<RuleConfig> {
        toml::from_str::<File>(text).unwrap_or_else(|e| panic!("{e}\n{text}")).rule
    }

    fn set(text: &str, default_allow: bool) -> RuleSet {
        RuleSet::compile(&configs(text), default_allow).unwrap_or_else(|e| panic!("{e:?}\n{text}"))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn undefined_groups_are_named_with_their_line() {
        let mut rules = configs(
            "[[rule]]\naction = \"allow\"\ngroups = [\"staff\", \"admins\"]\n\
             [[rule]]\naction = \"deny\"\n",
        );
        rules[0].conditions.groups_line = Some(3);
        let conditions = || rules.iter().map(|r| &r.conditions);
        let got = undefined_groups(conditions(), "rule", |g| g == "staff");
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("line 3: rule 1: group `admins` is not defined"), "{got:?}");
        assert!(undefined_groups(conditions(), "rule", |_| true).is_empty());
    }

    #[test]
    fn undefined_users_are_named_with_their_line() {
        let mut rules = configs(
            "[[rule]]\naction = \"allow\"\nusers = [\"alice\", \"*\", \"bob\"]\n\
             [[rule]]\naction = \"deny\"\n",
        );
        rules[0].conditions.users_line = Some(3);
        let conditions = || rules.iter().map(|r| &r.conditions);
        let got = undefined_users(conditions(), "rule", |u| u == "alice");
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("line 3: rule 1: user `bob` is not defined"), "{got:?}");
        assert!(undefined_users(conditions(), "rule", |_| true).is_empty());
    }

    /// An anonymous CONNECT to example.com:443 from 192.0.2.1 on listener "main",
    /// resolved to 203.0.113.5.
    fn req() -> Request<'static> {
        Request {
            listener: Some("main"),
            client: ip("192.0.2.1"),
            user: None,
            groups: &[],
            host: "example.com",
            port: 443,
            protocol: Protocol::Connect,
            dest: Some(ip("203.0.113.5")),
            params: None,
        }
    }

    fn deny(rule: usize) -> Verdict {
        Verdict::Deny { rule: Some(rule), reason: RULE_REASON }
    }

    const DEFAULT_DENY: Verdict = Verdict::Deny { rule: None, reason: DEFAULT_REASON };

    #[test]
    fn port_ranges() {
        let good: &[(&str, (u16, u16))] = &[
            ("80", (80, 80)),
            ("1", (1, 1)),
            ("65535", (65535, 65535)),
            ("8000-8999", (8000, 8999)),
            ("443-443", (443, 443)),
            ("1-65535", (1, 65535)),
        ];
        for (s, want) in good {
            assert_eq!(parse_port_range(s), Ok(*want), "{s}");
        }
        for s in [
            "0", "9-3", "70000", "", "-", "80-", "-80", "0-10", "1-70000", "+80", " 80", "8a",
            "1-2-3",
        ] {
            assert!(parse_port_range(s).is_err(), "`{s}` should be refused");
        }
    }

    #[test]
    fn host_patterns() {
        let table: &[(&str, &str, bool)] = &[
            ("example.com", "example.com", true),
            ("example.com", "EXAMPLE.Com", true),
            ("Example.COM", "example.com", true),
            ("example.com", "example.com.", true),
            ("example.com.", "example.com", true),
            ("example.com", "www.example.com", false),
            ("example.com", "example.co", false),
            ("example.com", "xexample.com", false),
            ("*.example.org", "example.org", false),
            ("*.example.org", "a.example.org", true),
            ("*.example.org", "a.b.example.org", true),
            ("*.example.org", "A.B.EXAMPLE.ORG", true),
            ("*.example.org", "a.example.org.", true),
            ("*.example.org", "badexample.org", false),
            ("*.example.org", ".example.org", false),
            ("*.example.org", "example.org.evil", false),
            ("*", "anything.at.all", true),
            ("*", "192.0.2.1", true),
            ("192.0.2.1", "192.0.2.1", true),
            ("::1", "[::1]", true),
            ("[::1]", "::1", true),
            ("2001:DB8::1", "2001:db8::1", true),
        ];
        for (pattern, host, want) in table {
            let p = HostPattern::parse(pattern).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.matches(bare_host(host)), *want, "{pattern} vs {host}");
        }
        for bad in [
            "*.",
            "",
            "*example.com",
            "a.*.com",
            "**",
            "*.*.com",
            ".example.com",
            "a..b",
            "example.com:443",
            "http://example.com",
            "a b",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "`{bad}` should be refused");
        }
    }

    #[test]
    fn protocol_names() {
        for p in Protocol::ALL {
            assert_eq!(p.as_str().parse::<Protocol>(), Ok(p));
        }
        assert!("HTTP".parse::<Protocol>().is_err());
        assert!("socks".parse::<Protocol>().is_err());
    }

    #[test]
    fn empty_rule_set_uses_the_default() {
        assert_eq!(set("", true).check(&req()), Verdict::Allow);
        assert_eq!(set("", false).check(&req()), DEFAULT_DENY);
        let dest_unknown = Request { dest: None, ..req() };
        assert_eq!(set("", true).check(&dest_unknown), Verdict::Allow);
        assert_eq!(set("", false).check(&dest_unknown), DEFAULT_DENY);
    }

    /// Each condition alone, matching and not matching: a deny rule with the condition,
    /// default allow; then an allow rule with it, default deny.
    #[test]
    fn each_condition_alone() {
        let groups = ["staff".to_string()];
        let alice = Request { user: Some("alice"), groups: &groups, ..req() };
        let de = Params {
            choices: vec![("country".into(), "de".into()), ("tier".into(), "gold".into())],
            ..Params::default()
        };
        let alice_de = Request { params: Some(&de), ..alice };
        let table: &[(&str, Request<'_>, bool)] = &[
            ("params = [\"country=de\"]", alice_de, true),
            ("params = [\"country=us\", \"tier=gold\"]", alice_de, true),
            ("params = [\"country=us\"]", alice_de, false),
            ("params = [\"country=DE\"]", alice_de, false),
            ("params = [\"country=de\"]", alice, false),
            ("listeners = [\"main\"]", req(), true),
            ("listeners = [\"other\", \"main\"]", req(), true),
            ("listeners = [\"other\"]", req(), false),
            ("listeners = [\"main\"]", Request { listener: None, ..req() }, false),
            ("listeners = [\"Main\"]", req(), false),
            ("clients = [\"192.0.2.0/24\"]", req(), true),
            ("clients = [\"10.0.0.0/8\", \"192.0.2.1\"]", req(), true),
            ("clients = [\"10.0.0.0/8\"]", req(), false),
            ("clients = [\"::/0\"]", req(), false),
            (
                "clients = [\"192.0.2.0/24\"]",
                Request { client: ip("::ffff:192.0.2.9"), ..req() },
                true,
            ),
            ("clients = [\"::1/128\"]", Request { client: ip("::1"), ..req() }, true),
            ("users = [\"alice\"]", alice, true),
            ("users = [\"bob\", \"alice\"]", alice, true),
            ("users = [\"bob\"]", alice, false),
            ("users = [\"Alice\"]", alice, false),
            ("users = [\"alice\"]", req(), false),
            ("users = [\"*\"]", alice, true),
            ("users = [\"*\"]", req(), false),
            ("groups = [\"staff\"]", alice, true),
            ("groups = [\"admins\", \"staff\"]", alice, true),
            ("groups = [\"admins\"]", alice, false),
            ("groups = [\"staff\"]", req(), false),
            ("hosts = [\"example.com\"]", req(), true),
            ("hosts = [\"*.example.com\"]", req(), false),
            ("hosts = [\"*.example.com\"]", Request { host: "WWW.example.com", ..req() }, true),
            ("hosts = [\"*\"]", req(), true),
            ("hosts = [\"example.org\"]", req(), false),
            ("destinations = [\"203.0.113.0/24\"]", req(), true),
            ("destinations = [\"198.51.100.0/24\"]", req(), false),
            (
                "destinations = [\"203.0.113.0/24\"]",
                Request { dest: Some(ip("::ffff:203.0.113.7")), ..req() },
                true,
            ),
            ("ports = [\"443\"]", req(), true),
            ("ports = [\"80\", \"400-500\"]", req(), true),
            ("ports = [\"80\", \"444-500\"]", req(), false),
            ("ports = [\"1-442\"]", req(), false),
            ("protocols = [\"connect\"]", req(), true),
            ("protocols = [\"http\", \"connect\"]", req(), true),
            ("protocols = [\"http\"]", req(), false),
            ("protocols = [\"udp\"]", Request { protocol: Protocol::Udp, ..req() }, true),
            ("protocols = [\"socks4\"]", Request { protocol: Protocol::Socks5, ..req() }, false),
            ("protocols = [\"bind\"]", Request { protocol: Protocol::Bind, ..req() }, true),
            ("protocols = [\"connect\"]", Request { protocol: Protocol::Bind, ..req() }, false),
        ];
        for (condition, r, matches) in table {
            let denying = set(&format!("[[rule]]\naction = \"deny\"\n{condition}\n"), true);
            let want = if *matches { deny(0) } else { Verdict::Allow };
            assert_eq!(denying.check(r), want, "deny rule {condition} for {r:?}");
            let allowing = set(&format!("[[rule]]\naction = \"allow\"\n{condition}\n"), false);
            let want = if *matches { Verdict::Allow } else { DEFAULT_DENY };
            assert_eq!(allowing.check(r), want, "allow rule {condition} for {r:?}");
        }
    }

    #[test]
    fn all_conditions_must_match() {
        let s = set(
            "[[rule]]\naction = \"deny\"\nclients = [\"192.0.2.0/24\"]\nports = [\"443\"]\n\
             protocols = [\"connect\"]\nhosts = [\"example.com\"]\n",
            true,
        );
        assert_eq!(s.check(&req()), deny(0));
        assert_eq!(s.check(&Request { port: 80, ..req() }), Verdict::Allow);
        assert_eq!(s.check(&Request { protocol: Protocol::Http, ..req() }), Verdict::Allow);
        assert_eq!(s.check(&Request { client: ip("10.0.0.1"), ..req() }), Verdict::Allow);
        assert_eq!(s.check(&Request { host: "example.net", ..req() }), Verdict::Allow);
    }

    #[test]
    fn first_match_wins() {
        let text = "[[rule]]\naction = \"allow\"\nclients = [\"192.0.2.1\"]\n\
                    [[rule]]\naction = \"deny\"\nclients = [\"192.0.2.0/24\"]\n\
                    [[rule]]\naction = \"allow\"\n";
        let s = set(text, false);
        assert_eq!(s.check(&req()), Verdict::Allow);
        assert_eq!(s.check(&Request { client: ip("192.0.2.2"), ..req() }), deny(1));
        assert_eq!(s.check(&Request { client: ip("10.0.0.1"), ..req() }), Verdict::Allow);
        // Reversed, the broad deny shadows the narrow allow.
        let text = "[[rule]]\naction = \"deny\"\nclients = [\"192.0.2.0/24\"]\n\
                    [[rule]]\naction = \"allow\"\nclients = [\"192.0.2.1\"]\n";
        assert_eq!(set(text, true).check(&req()), deny(0));
    }

    #[test]
    fn need_address_ordering() {
        let unresolved = Request { dest: None, ..req() };
        // A destination rule first: the address is needed.
        let text = "[[rule]]\naction = \"deny\"\ndestinations = [\"10.0.0.0/8\"]\n\
                    [[rule]]\naction = \"allow\"\n";
        let s = set(text, false);
        assert_eq!(s.check(&unresolved), Verdict::NeedAddress);
        assert_eq!(s.check(&Request { dest: Some(ip("10.1.1.1")), ..req() }), deny(0));
        assert_eq!(s.check(&Request { dest: Some(ip("203.0.113.5")), ..req() }), Verdict::Allow);
        // A decided match before it: no address needed.
        let text = "[[rule]]\naction = \"allow\"\nhosts = [\"example.com\"]\n\
                    [[rule]]\naction = \"deny\"\ndestinations = [\"10.0.0.0/8\"]\n";
        let s = set(text, true);
        assert_eq!(s.check(&unresolved), Verdict::Allow);
        assert_eq!(s.check(&Request { host: "other.net", ..unresolved }), Verdict::NeedAddress);
        // A destination rule whose other conditions do not match is passed over.
        let text =
            "[[rule]]\naction = \"deny\"\nports = [\"22\"]\ndestinations = [\"10.0.0.0/8\"]\n\
                    [[rule]]\naction = \"deny\"\nhosts = [\"example.com\"]\n";
        let s = set(text, true);
        assert_eq!(s.check(&unresolved), deny(1));
        assert_eq!(s.check(&Request { port: 22, ..unresolved }), Verdict::NeedAddress);
        // With no rule matching at all, the default decides even without an address.
        assert_eq!(s.check(&Request { host: "a.net", ..unresolved }), Verdict::Allow);
    }

    #[test]
    fn params_conditions_are_name_value_pairs() {
        for bad in ["country", "=de", "country=", "a=b=c", ""] {
            let text = format!("[[rule]]\naction = \"allow\"\nparams = [\"{bad}\"]\n");
            let errs = RuleSet::compile(&configs(&text), true).expect_err(bad);
            assert!(errs[0].1.contains("NAME=VALUE"), "{bad}: {errs:?}");
        }
    }

    #[test]
    fn rule_names() {
        let text = "[[rule]]\naction = \"allow\"\n\
                    [[rule]]\nname = \"staff-anywhere\"\naction = \"allow\"\n\
                    [[rule]]\naction = \"deny\"\n";
        let s = set(text, true);
        assert_eq!(s.len(), 3);
        assert!(!s.is_empty());
        assert_eq!(s.rule_name(0), "rule 1");
        assert_eq!(s.rule_name(1), "staff-anywhere");
        assert_eq!(s.rule_name(2), "rule 3");
        assert_eq!(s.rule_name(3), "unknown rule");
    }

    #[test]
    fn compile_errors_carry_rule_indexes() {
        let text = "[[rule]]\naction = \"allow\"\nclients = [\"10.0.0.0/33\", \"10.0.0.0/8\"]\n\
                    [[rule]]\naction = \"deny\"\n\
                    [[rule]]\naction = \"deny\"\nports = [\"0\", \"9-3\", \"70000\"]\n\
                    [[rule]]\naction = \"allow\"\nprotocols = [\"gopher\"]\nhosts = [\"*.\"]\n\
                    [[rule]]\naction = \"allow\"\nusers = []\ndestinations = [\"nope\"]\n\
                    [[rule]]\naction = \"allow\"\nname = \"\"\nlisteners = [\"\"]\n";
        let errors = RuleSet::compile(&configs(text), true).expect_err("bad rules");
        let indexes: Vec<usize> = errors.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, [0, 2, 2, 2, 3, 3, 4, 4, 5, 5], "{errors:#?}");
        let text_of = |n: usize| errors[n].1.as_str();
        assert!(text_of(0).contains("`clients`") && text_of(0).contains("10.0.0.0/33"));
        assert!(text_of(1).contains("`0`"));
        assert!(text_of(2).contains("`9-3`"));
        assert!(text_of(3).contains("`70000`"));
        assert!(text_of(4).contains("gopher"));
        assert!(text_of(5).contains("`*.`"));
        assert!(text_of(6).contains("`users = []`"));
        assert!(text_of(7).contains("`destinations`"));
        assert!(text_of(8).contains("`name`"));
        assert!(text_of(9).contains("`listeners`"));
    }

    #[test]
    fn an_unknown_action_is_reported_with_the_rest_of_its_rule() {
        let text = "[[rule]]\naction = \"permit\"\nclients = [\"10.0.0.0/33\"]\n";
        let errors = RuleSet::compile(&configs(text), true).expect_err("bad rule");
        let texts: Vec<&str> = errors.iter().map(|(_, e)| e.as_str()).collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(texts[0].contains("\"permit\""), "{texts:?}");
        assert!(texts[1].contains("10.0.0.0/33"), "{texts:?}");
    }

    #[test]
    fn a_missing_action_and_a_wrong_type_are_serde_errors() {
        assert!(toml::from_str::<File>("[[rule]]\n").is_err());
        assert!(toml::from_str::<File>("[[rule]]\naction = \"allow\"\nports = [443]\n").is_err());
    }

    #[test]
    fn users_star_and_names_together() {
        let s = set("[[rule]]\naction = \"deny\"\nusers = [\"*\", \"bob\"]\n", true);
        assert_eq!(s.check(&Request { user: Some("anyone"), ..req() }), deny(0));
        assert_eq!(s.check(&req()), Verdict::Allow);
    }

    #[test]
    fn restricts_clients_table() {
        let table: &[(&str, bool, bool)] = &[
            // (rules, default_allow, closed to strangers)
            ("", true, false),
            ("", false, true),
            // An allow list with a default deny, or a closing deny.
            ("[[rule]]\naction = \"allow\"\nclients = [\"10.0.0.0/8\"]\n", false, true),
            (
                "[[rule]]\naction = \"allow\"\nclients = [\"10.0.0.0/8\"]\n\
                 [[rule]]\naction = \"deny\"\n",
                true,
                true,
            ),
            // An allow list with default allow restricts nothing.
            ("[[rule]]\naction = \"allow\"\nclients = [\"10.0.0.0/8\"]\n", true, false),
            // A deny list leaves everyone else in.
            ("[[rule]]\naction = \"deny\"\nclients = [\"203.0.113.0/24\"]\n", true, false),
            // Authenticated users only.
            ("[[rule]]\naction = \"allow\"\nusers = [\"*\"]\n[[rule]]\naction = \"deny\"\n", true, true),
            ("[[rule]]\naction = \"allow\"\ngroups = [\"staff\"]\n", false, true),
            // Open to anyone for some destinations is still open.
            ("[[rule]]\naction = \"allow\"\nports = [\"443\"]\n", false, false),
            // A partial deny does not close.
            ("[[rule]]\naction = \"deny\"\nports = [\"25\"]\n", true, false),
            // A deny whose conditions cover everything does.
            (
                "[[rule]]\naction = \"deny\"\nports = [\"1-1000\", \"1001-65535\"]\nhosts = [\"*\"]\n\
                 clients = [\"0.0.0.0/0\", \"::/0\"]\nprotocols = [\"http\", \"connect\", \"socks5\", \
                 \"socks4\", \"relay\", \"udp\", \"bind\"]\n",
                true,
                true,
            ),
            // Without `bind`, a stranger may still BIND.
            (
                "[[rule]]\naction = \"deny\"\nprotocols = [\"http\", \"connect\", \"socks5\", \
                 \"socks4\", \"relay\", \"udp\"]\n",
                true,
                false,
            ),
            ("[[rule]]\naction = \"deny\"\nclients = [\"0.0.0.0/0\"]\n", true, false),
            // Allow rules whose clients cover all of IPv4 let anyone in.
            ("[[rule]]\naction = \"allow\"\nclients = [\"0.0.0.0/1\", \"128.0.0.0/1\"]\n", false, false),
            ("[[rule]]\naction = \"allow\"\nclients = [\"::/0\"]\n", false, false),
            ("[[rule]]\naction = \"allow\"\nclients = [\"0.0.0.0/1\", \"::1\"]\n", false, true),
            // A listener-limited deny is not sure to apply without a listener.
            ("[[rule]]\naction = \"deny\"\nlisteners = [\"main\"]\n", true, false),
        ];
        for (text, default_allow, want) in table {
            assert_eq!(set(text, *default_allow).restricts_clients(), *want, "{text}");
        }
    }

    #[test]
    fn restricts_clients_per_listener() {
        let text = "[[rule]]\naction = \"allow\"\nlisteners = [\"internal\"]\n\
                    [[rule]]\naction = \"deny\"\nlisteners = [\"public\"]\n";
        let s = set(text, true);
        assert!(s.restricts_clients_on("public"));
        assert!(!s.restricts_clients_on("internal"));
        assert!(!s.restricts_clients_on("other"));
        assert!(!s.restricts_clients());
        let text = "[[rule]]\naction = \"allow\"\nlisteners = [\"internal\"]\n";
        let s = set(text, false);
        assert!(s.restricts_clients_on("public"));
        assert!(!s.restricts_clients_on("internal"));
        assert!(!s.restricts_clients());
    }

    #[test]
    fn coverage() {
        let blocks = |list: &[&str]| -> Vec<Cidr> {
            list.iter().map(|s| s.parse().expect("test block")).collect()
        };
        assert!(covers_family(&blocks(&["0.0.0.0/0"]), false));
        assert!(!covers_family(&blocks(&["0.0.0.0/0"]), true));
        assert!(covers_family(&blocks(&["128.0.0.0/1", "0.0.0.0/2", "64.0.0.0/2"]), false));
        assert!(!covers_family(&blocks(&["128.0.0.0/1", "0.0.0.0/2"]), false));
        assert!(covers_family(&blocks(&["::/1", "8000::/1"]), true));
        assert!(!covers_family(&blocks(&["::/1", "8000::/2"]), true));
        assert!(!covers_family(&[], false));
        assert!(covers_everything(&blocks(&["::/0", "0.0.0.0/0"])));
    }
}
