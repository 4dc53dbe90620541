//! The checks of a configuration beyond its types: open proxies, listeners' kinds and
//! targets, relays to the proxy's own listeners, HTTP/2 windows.

use std::net::SocketAddr;

use super::{routing, Config, DefaultAction, Dns, Http2, Listener, ListenerKind};

impl Config {
    /// Checks that need the final listener list (after command-line overrides).
    pub fn check_listeners(&self) -> Result<(), String> {
        let listeners = self.effective_listeners();
        for l in &listeners {
            if let Some(msg) = open_proxy_problem(self, l)
                .or_else(|| target_problem(l))
                .or_else(|| loop_problem(&listeners, l))
            {
                return Err(msg);
            }
        }
        match self.parents.iter().find_map(|p| routing::loop_problem(p, &listeners)) {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    /// The problems of the parents, groups and routes (without lines: `Config::parse`
    /// reports them with theirs), for code that builds a configuration itself.
    pub(crate) fn routing_problems(&self) -> Vec<String> {
        routing::problems(&self.parents, &self.groups, &self.routes, &self.listeners)
            .into_iter()
            .map(|(_, message)| message)
            .collect()
    }

    /// Why listener `l` would be an open proxy under this configuration's rules, if it
    /// would (the start-up check; SIGHUP runs it on the listeners already running).
    pub(crate) fn open_proxy_problem(&self, l: &Listener) -> Option<String> {
        open_proxy_problem(self, l)
    }
}

/// A listener reachable from other machines with neither authentication nor a rule
/// restricting client addresses would be an open proxy: refuse it unless the operator
/// says so explicitly.
pub(super) fn open_proxy_problem(config: &Config, l: &Listener) -> Option<String> {
    if l.listen.ip().is_loopback() || config.allow_open_proxy || l.auth {
        return None;
    }
    let default_allow = config.default_action == DefaultAction::Allow;
    if let Ok(rules) = crate::acl::RuleSet::compile(&config.rules, default_allow) {
        let restricted = match &l.name {
            Some(name) => rules.restricts_clients_on(name),
            None => rules.restricts_clients(),
        };
        if restricted {
            return None;
        }
    }
    Some(format!(
        "listener {} on {} would be an open proxy: anyone who can reach it could use it. \
         Bind it to a loopback address, set `auth = true` on it (with users in [auth]), \
         add a [[rule]] limiting `clients`, or set `allow_open_proxy = true` at the top of \
         the configuration if that is really what you want",
        l.kind, l.listen
    ))
}

/// Values h2 would refuse (it panics on windows above 2^31-1) or that make no sense.
pub(super) fn http2_problems(h: &Http2) -> Vec<(&'static str, String)> {
    // RFC 9113 6.9.1: a flow-control window is at most 2^31-1.
    const MAX_WINDOW: u32 = (1 << 31) - 1;
    let mut out = Vec::new();
    for (key, v) in [
        ("initial_stream_window", h.initial_stream_window),
        ("initial_connection_window", h.initial_connection_window),
    ] {
        if !(65_535..=MAX_WINDOW).contains(&v) {
            out.push((key, format!("must be between 65535 and {MAX_WINDOW}")));
        }
    }
    if h.max_concurrent_streams == 0 {
        out.push(("max_concurrent_streams", "must be at least 1".into()));
    }
    if h.max_header_list_size < 1024 {
        out.push(("max_header_list_size", "must be at least 1024".into()));
    }
    if h.max_send_buffer_size < 16 * 1024 || h.max_send_buffer_size > MAX_WINDOW as usize {
        out.push(("max_send_buffer_size", "must be between 16384 and 2147483647".into()));
    }
    if h.flood_window.is_zero() {
        out.push(("flood_window", "must not be zero".into()));
    }
    out
}

/// `proxy_protocol` without the balancers it may come from (anyone could then claim any
/// address), from every address (`/0`, the same, unless `allow_open_proxy`), the
/// balancers without `proxy_protocol`, or either on a UDP listener.
pub(super) fn proxy_protocol_problem(
    config: &Config,
    l: &Listener,
) -> Option<(&'static str, String)> {
    let everyone = l.proxy_protocol_from.iter().find(|c| c.prefix() == 0);
    if let Some(all) = everyone.filter(|_| l.proxy_protocol.is_some() && !config.allow_open_proxy) {
        return Some((
            "proxy_protocol_from",
            format!(
                "{all} lets any address send the header and so claim any client address \
                 (rules on clients, per-client limits and logs would trust it): name the load \
                 balancers, or set `allow_open_proxy = true` at the top of the configuration \
                 if that is really what you want"
            ),
        ));
    }
    match (l.proxy_protocol, l.proxy_protocol_from.is_empty()) {
        (Some(_), _) if l.kind == ListenerKind::UdpRelay => Some((
            "proxy_protocol",
            "a udp-relay listener takes no `proxy_protocol` (it is read on TCP listeners)".into(),
        )),
        (Some(_), true) => Some((
            "proxy_protocol",
            "needs `proxy_protocol_from = [\"address/prefix\", ...]`: the load balancers \
             allowed to send the header (anyone else could claim any client address)"
                .into(),
        )),
        (None, false) => Some((
            "proxy_protocol_from",
            "is only read with `proxy_protocol = \"v1\" | \"v2\" | \"any\"`".into(),
        )),
        _ => target_proxy_protocol_problem(l).map(|m| ("target_proxy_protocol", m)),
    }
}

fn target_proxy_protocol_problem(l: &Listener) -> Option<String> {
    let v = l.target_proxy_protocol?;
    if l.kind != ListenerKind::Relay {
        return Some(format!("is for relay listeners, not {}", l.kind));
    }
    if v == super::ProxyProtocol::Any {
        return Some("sends one version: \"v1\" or \"v2\"".into());
    }
    None
}

pub(super) fn target_problem(l: &Listener) -> Option<String> {
    match (l.kind.needs_target(), &l.target) {
        (true, None) => {
            return Some(format!("a {} listener needs `target = \"host:port\"`", l.kind))
        }
        (false, Some(_)) => return Some(format!("a {} listener takes no `target`", l.kind)),
        _ => {}
    }
    match (l.kind, &l.tls) {
        (ListenerKind::Https, None) => {
            return Some(
                "an https listener needs [listener.tls] with `cert` and `key` \
                 (try `rustle cert --self-signed NAME`)"
                    .into(),
            )
        }
        (ListenerKind::Http, Some(_)) => {
            return Some("an http listener takes no [listener.tls]: use kind = \"https\"".into())
        }
        (ListenerKind::Socks | ListenerKind::UdpRelay, Some(_)) => {
            return Some(format!("a {} listener takes no [listener.tls]", l.kind))
        }
        _ => {}
    }
    if l.target_tls.is_some() && l.kind != ListenerKind::Relay {
        return Some(format!("a {} listener takes no [listener.target_tls]", l.kind));
    }
    if l.auth && l.kind.needs_target() {
        // Accepted and ignored, `auth` would read as protection a relay does not give.
        return Some(format!(
            "a {} listener takes no `auth`: it asks no credentials (limit it with client \
             rules, or client certificates on a TLS relay)",
            l.kind
        ));
    }
    None
}

/// A relay whose target is one of the proxy's own listeners (on the same transport) would
/// connect to itself: every connection or datagram would come back in. Addresses and
/// `localhost` are recognised here, with the built-in check's notion of "the same
/// address" (a wildcard listener is every local address); other names, and listeners on
/// port 0, are known only at run time (where the TCP relay's connect refuses the loop).
pub(super) fn loop_problem(listeners: &[Listener], l: &Listener) -> Option<String> {
    let target = l.target.as_ref().filter(|_| l.kind.needs_target())?;
    let udp = l.kind == ListenerKind::UdpRelay;
    let o = own_listener(listeners, &target.host, target.port, udp)?;
    Some(format!(
        "target {target} of the {} listener on {} is this proxy's own listener {} \
         ({}): the relay would connect to itself",
        l.kind, l.listen, o.listen, o.kind
    ))
}

/// The listener that connecting to `host:port` (over UDP or TCP) would reach, as far as
/// the configuration tells: addresses and `localhost`, with the built-in check's notion of
/// "the same address" (a wildcard listener is every local address); other names, and
/// listeners on port 0, are known only at run time.
pub(super) fn own_listener<'a>(
    listeners: &'a [Listener],
    host: &str,
    port: u16,
    udp: bool,
) -> Option<&'a Listener> {
    let ips: Vec<std::net::IpAddr> = match host.parse() {
        Ok(ip) => vec![ip],
        Err(_) if host == "localhost" => {
            vec![std::net::Ipv4Addr::LOCALHOST.into(), std::net::Ipv6Addr::LOCALHOST.into()]
        }
        Err(_) => return None,
    };
    listeners
        .iter()
        .filter(|o| o.listen.port() != 0 && (o.kind == ListenerKind::UdpRelay) == udp)
        .find(|o| ips.iter().any(|&ip| crate::acl::reaches(SocketAddr::new(ip, port), o.listen)))
}

/// `[dns]` values that cannot work.
pub(super) fn dns_problems(d: &Dns) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for s in &d.servers {
        if let Err(e) = super::settings::parse_server(s) {
            out.push(("servers", e));
        }
    }
    if d.ca.is_some() && !d.encrypted() {
        out.push(("ca", "no tls:// or https:// server in dns.servers to verify with it".into()));
    }
    if d.timeout.is_zero() {
        out.push(("timeout", "must not be zero".into()));
    }
    if d.attempts == 0 {
        out.push(("attempts", "must be at least 1".into()));
    }
    if d.ttl_min > d.ttl_max {
        out.push(("ttl_min", "must not be above ttl_max".into()));
    }
    for (name, ips) in &d.hosts {
        if name.is_empty()
            || name.parse::<std::net::IpAddr>().is_ok()
            || name.contains(['/', ' ', ':'])
        {
            out.push(("hosts", format!("`{name}` is not a host name")));
        } else if ips.is_empty() {
            out.push(("hosts", format!("`{name}` has no address")));
        }
    }
    out
}

/// `[auth.params]` and the `params` conditions of rules and routes: a separator that no
/// name or value holds, declared names and values a user name can carry, and conditions
/// that name only declared parameters and values. Each problem with its key path.
pub(super) fn params_problems(config: &Config) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let key = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    if config.auth.refusal_delay > std::time::Duration::from_secs(10) {
        let message = "auth.refusal_delay: at most 10s (longer holds every refused client)";
        out.push((key(&["auth", "refusal_delay"]), message.to_string()));
    }
    let declared = config.auth.params.as_ref();
    if let Some(p) = declared {
        let sep = p.separator.as_str();
        let bad_sep = |c: char| {
            c.is_ascii_alphanumeric() || c == '_' || c == ':' || c.is_whitespace() || c.is_control()
        };
        if sep.is_empty() || sep.chars().count() > 4 || sep.chars().any(bad_sep) {
            out.push((
                key(&["auth", "params", "separator"]),
                "auth.params.separator: 1 to 4 characters, none of them a letter, digit, `_`, \
                 `:`, space or control character (\"-\" or \"+\", say)"
                    .to_string(),
            ));
        }
        if p.max_ttl.is_zero() {
            let message = "auth.params.max_ttl: must not be zero".to_string();
            out.push((key(&["auth", "params", "max_ttl"]), message));
        }
        let word = |s: &str| {
            (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        for (i, c) in p.choices.iter().enumerate() {
            let at = key(&["auth", "params", "choice", &i.to_string()]);
            let this = format!("auth.params.choice `{}`", c.name);
            if !word(&c.name) {
                out.push((at.clone(), format!("{this}: a name is 1 to 32 of A-Z, a-z, 0-9 and _")));
            }
            if c.name == "session" || c.name == "ttl" {
                out.push((at.clone(), format!("{this}: `{}` is built in", c.name)));
            }
            if p.choices[..i].iter().any(|o| o.name == c.name) {
                out.push((at.clone(), format!("{this}: declared twice")));
            }
            if c.values.is_empty() {
                out.push((at.clone(), format!("{this}: `values = []`: no value could be given")));
            }
            for v in &c.values {
                let odd = v.is_empty()
                    || v.len() > 64
                    || v.contains(':')
                    || v.chars().any(|ch| ch.is_whitespace() || ch.is_control())
                    // Not one of its characters either: with `--`, `x-` then `--`
                    // would read as `x` and `-...`.
                    || v.chars().any(|ch| sep.contains(ch));
                if odd {
                    out.push((
                        at.clone(),
                        format!(
                            "{this}: value `{v}`: 1 to 64 characters, without the separator \
                             (or any of its characters), `:`, spaces or control characters"
                        ),
                    ));
                }
            }
        }
    }
    let tables = config
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| ("rule", i, &r.conditions))
        .chain(config.routes.iter().enumerate().map(|(i, r)| ("route", i, &r.conditions)));
    for (table, i, conditions) in tables {
        let at = key(&[table, &i.to_string(), "params"]);
        for wanted in conditions.params.iter().flatten() {
            let Some((name, value)) = wanted.split_once('=') else { continue };
            let message = match declared {
                None => format!("{table} {}: `params` needs [auth.params]", i + 1),
                Some(p) => match p.choices.iter().find(|c| c.name == name) {
                    None => format!(
                        "{table} {}: `{wanted}`: no parameter `{name}` in [auth.params] \
                         (only declared ones, [[auth.params.choice]], can be matched)",
                        i + 1
                    ),
                    Some(c) if !c.values.iter().any(|v| v == value) => format!(
                        "{table} {}: `{wanted}`: `{value}` is not a declared value of `{name}`",
                        i + 1
                    ),
                    Some(_) => continue,
                },
            };
            out.push((at.clone(), message));
        }
    }
    out
}
