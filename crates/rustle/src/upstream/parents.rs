//! Connections through parent proxies: a route's hops, each a parent or a group that
//! picks one of its parents, tunnelled one through the next (HTTP CONNECT, SOCKS5,
//! SOCKS4a, `https` parents over TLS), the last one to the target; an HTTP parent at the
//! end takes a plain HTTP request itself, in absolute form. A parent that cannot be
//! reached or breaks off counts a failure towards being marked down, and the connection
//! is tried again with a fresh pick, so that a group's surviving members take over at
//! once; a parent that answers with a refusal is not at fault, and its answer is the
//! client's.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use rustle_proto::socks5::Reply;

use super::{target_tls, Connected, Tls, Upstreams, Want};
use crate::acl::Protocol;
use crate::config::{ParentKind, Timeouts};
use crate::error::{ConnectError, Error};
use crate::io::conn::Stream;
use crate::policy::route::egress::Picked;
use crate::policy::route::{Hop, Parent, Pick};
use crate::policy::Policy;
use crate::telemetry::accesslog::Via;
use crate::upstream::hop::{self, Credentials, HopKind};

/// Attempts at one connection: a failed parent is picked around on the next.
const ATTEMPTS: usize = 4;

/// How a chain failed: the hop, the error, and whether the parent is at fault.
struct Failure {
    hop: usize,
    error: Error,
    broken: bool,
}

fn parent_error(route: &str, p: &Parent, reason: String, status: u16, reply: Reply) -> Error {
    let addr = if p.host.contains(':') {
        format!("[{}]:{}", p.host, p.port)
    } else {
        format!("{}:{}", p.host, p.port)
    };
    Error::Connect(ConnectError::Parent(Box::new(crate::error::ParentFailure {
        route: route.into(),
        name: p.name.clone(),
        addr: addr.into(),
        reason,
        status,
        reply,
    })))
}

impl Upstreams {
    /// A connection to `want`'s target through the hops of route `route`.
    pub(super) async fn through(
        &self,
        policy: &Policy,
        want: &Want<'_>,
        rules_too: bool,
        (route, hops): (&str, &[Hop]),
        (mut picked, from): (Option<Vec<&Arc<Parent>>>, Option<&super::Leaving<'_>>),
        timeouts: &Timeouts,
    ) -> Result<Connected, Error> {
        let mut last: Option<Error> = None;
        for _ in 0..ATTEMPTS {
            let chain = match picked.take() {
                Some(chain) => chain,
                None => match pick_chain(policy, want, hops) {
                    Ok(chain) => chain,
                    Err(why) => {
                        return Err(last.unwrap_or(Error::Connect(ConnectError::NoParent(why))))
                    }
                },
            };
            if chain.is_empty() {
                return self.direct(policy, want, rules_too, timeouts, from).await;
            }
            let started = Instant::now();
            let egress = from.map(|f| &f.picked);
            match self.chain(policy, want, route, &chain, timeouts, egress).await {
                Ok(mut c) => {
                    let took = started.elapsed();
                    for p in &chain {
                        p.health.stats.connect.observe(took);
                        if p.succeeded() {
                            tracing::info!("{p} is up again");
                        }
                    }
                    c.via = Some(via(policy, route, &chain));
                    let key = pool_key(want, &chain, c.absolute.is_some());
                    c.pool_key = Some(match from {
                        Some(f) => from_key(&key, f),
                        None => key,
                    });
                    return Ok(c);
                }
                Err(Failure { hop, error, broken: true }) => {
                    let p = chain[hop];
                    if p.failed(Instant::now()) {
                        tracing::warn!(
                            "{p} marked down for {:?} after {} failure(s): {error}",
                            p.down_for,
                            p.max_failures.max(1)
                        );
                    }
                    last = Some(error);
                }
                Err(Failure { error, .. }) => return Err(error),
            }
        }
        Err(last.unwrap_or(Error::Connect(ConnectError::NoParent(format!(
            "route `{route}`: no parent answered"
        )))))
    }

    /// One attempt along `chain`.
    async fn chain(
        &self,
        policy: &Policy,
        want: &Want<'_>,
        route: &str,
        chain: &[&Arc<Parent>],
        timeouts: &Timeouts,
        egress: Option<&Picked<'_>>,
    ) -> Result<Connected, Failure> {
        let first = chain[0];
        let fail = |hop: usize, reason: String, status: u16, reply: Reply, broken: bool| Failure {
            hop,
            error: parent_error(route, chain[hop], reason, status, reply),
            broken,
        };
        let (tcp, addr) = self
            .connect_tcp(&first.host, first.port, timeouts.connect, &|_| None, egress)
            .await
            .map_err(|e| {
                let (status, reply) = match e {
                    ConnectError::Timeout(_) => (504, Reply::TtlExpired),
                    // Not the parent's fault: the route cannot reach it.
                    ConnectError::NoEgress(_) | ConnectError::Bind { .. } => {
                        return Failure { hop: 0, error: Error::Connect(e), broken: false }
                    }
                    _ => (502, Reply::GeneralFailure),
                };
                fail(0, format!("cannot be reached: {e}"), status, reply, true)
            })?;
        let mut stream = Stream::Tcp(tcp);
        if let Some(version) = first.proxy_protocol {
            send_header(&mut stream, version, Some((*want.addrs.0, *want.addrs.1)), timeouts)
                .await
                .map_err(|why| fail(0, why, 502, Reply::GeneralFailure, true))?;
        }
        if first.kind == ParentKind::Https {
            stream = parent_tls(policy, first, stream, timeouts)
                .await
                .map_err(|why| fail(0, why, 502, Reply::GeneralFailure, true))?;
        }
        let mut absolute = None;
        let mut early = Vec::new();
        for (i, p) in chain.iter().enumerate() {
            let next = chain.get(i + 1);
            let creds = credentials(p, want.user);
            let http = matches!(p.kind, ParentKind::Http | ParentKind::Https);
            if next.is_none() && http && takes_absolute(want, chain) {
                absolute = Some(creds.map(basic));
                break;
            }
            let (host, port): (&str, u16) = match next {
                Some(n) => (&n.host, n.port),
                None => (want.host, want.port),
            };
            let kind = hop_kind(p.kind);
            early =
                hop::tunnel(&mut stream, kind, creds, host, port, timeouts.connect).await.map_err(
                    |e| fail(i, e.to_string(), e.status(), e.socks5_reply(), e.parent_failed()),
                )?;
            if let Some(n) = next.filter(|n| n.kind == ParentKind::Https) {
                if !early.is_empty() {
                    let why = "sent bytes before the TLS handshake with the next parent".into();
                    return Err(fail(i, why, 502, Reply::GeneralFailure, true));
                }
                stream = parent_tls(policy, n, stream, timeouts)
                    .await
                    .map_err(|why| fail(i + 1, why, 502, Reply::GeneralFailure, true))?;
            }
        }
        if !matches!(want.tls, Tls::Plain) && !early.is_empty() {
            let why = "sent bytes before the TLS handshake with the target".into();
            return Err(fail(chain.len() - 1, why, 502, Reply::GeneralFailure, true));
        }
        let stream = target_tls(policy, want, stream, addr, timeouts)
            .await
            .map_err(|error| Failure { hop: chain.len() - 1, error, broken: false })?;
        let private = first.proxy_protocol.is_some();
        Ok(Connected {
            stream,
            addr,
            reused: false,
            via: None,
            pool_key: None,
            absolute,
            early,
            private,
        })
    }
}

/// A PROXY protocol header to a parent, before anything else on the connection.
async fn send_header(
    stream: &mut Stream,
    version: crate::config::ProxyProtocol,
    addrs: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
    timeouts: &Timeouts,
) -> Result<(), String> {
    let header = super::proxy_header(version, addrs);
    super::write_first(stream, &header, timeouts.connect)
        .await
        .map_err(|e| format!("sending the PROXY protocol header: {e}"))
}

/// TLS to an `https` parent, verified with its `ca` (or the system's roots) for its
/// `server_name`.
async fn parent_tls(
    policy: &Policy,
    p: &Parent,
    stream: Stream,
    timeouts: &Timeouts,
) -> Result<Stream, String> {
    let Some(config) = policy.parent_tls(p.index).cloned() else {
        return Err("has no TLS settings".into());
    };
    let name = rustls::pki_types::ServerName::try_from(p.server_name.to_string())
        .map_err(|_| format!("`{}` is not a server name", p.server_name))?;
    crate::io::tls::connect_over(config, name, stream, timeouts.handshake)
        .await
        .map_err(|e| format!("TLS failed: {e}"))
}

/// `Basic base64(user:password)`, the value of a `Proxy-Authorization` field.
fn basic(c: Credentials<'_>) -> Box<[u8]> {
    use base64::Engine as _;
    let token =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.user, c.password));
    format!("Basic {token}").into_bytes().into_boxed_slice()
}

/// One parent per hop, picked now (a hop whose group falls back to `direct` is skipped);
/// the reason when a hop has none to give.
pub(super) fn pick_chain<'p>(
    policy: &'p Policy,
    want: &Want<'_>,
    hops: &[Hop],
) -> Result<Vec<&'p Arc<Parent>>, String> {
    let now = Instant::now();
    let mut chain = Vec::with_capacity(hops.len());
    for hop in hops {
        match policy.routes.pick_seeded(hop, want.user, want.client, want.seed, now) {
            Pick::Parent(p) => chain.push(p),
            Pick::Direct => {}
            Pick::Deny(why) => return Err(why),
        }
    }
    Ok(chain)
}

/// The log's record of a connection through `chain` for route `route`, counting it as
/// active on the route and on each parent until it is dropped.
fn via(policy: &Policy, route: &str, chain: &[&Arc<Parent>]) -> Rc<Via> {
    let parents: Vec<&str> = chain.iter().map(|p| &*p.name).collect();
    let counters = policy.routes.route_counters(route).into_iter();
    let counters = counters.chain(chain.iter().map(|p| &p.health.stats.traffic));
    let through = crate::telemetry::metrics::Through::new(counters);
    Rc::new(Via { route: route.into(), parents: parents.join(",").into(), through })
}

/// Where a connection through `chain` is pooled: the parents' names, then the target
/// unless the last parent takes requests for any target (absolute form), and the user
/// when a parent was sent the client's own name. A NUL first, so that no `host:port` key
/// is ever the same.
fn pool_key(want: &Want<'_>, chain: &[&Arc<Parent>], absolute: bool) -> Box<[u8]> {
    let mut key = Vec::with_capacity(64);
    key.push(0);
    for p in chain {
        key.extend_from_slice(p.name.as_bytes());
        key.push(b'>');
    }
    if !absolute {
        if matches!(want.tls, Tls::Origin) {
            key.extend_from_slice(b"https://");
        }
        key.extend(want.host.bytes().map(|b| b.to_ascii_lowercase()));
        key.push(b':');
        key.extend_from_slice(want.port.to_string().as_bytes());
        // A tunnel through a parent that was given the client's own name (`pass_user`)
        // is that user's: another's requests must not ride it. (In absolute form each
        // request carries its own credentials.)
        if let Some(user) = want.user.filter(|_| chain.iter().any(|p| p.pass_user)) {
            key.push(0);
            key.extend_from_slice(user.as_bytes());
        }
    }
    // The first parent was told who the client is (a PROXY protocol header): the
    // connection is that client connection's alone. (The front ends pin such connections
    // rather than pool them, `Connected::private`; the key keeps any that reach the pool
    // to the same client connection.)
    if chain.first().is_some_and(|p| p.proxy_protocol.is_some()) {
        key.extend_from_slice(b"\0client=");
        key.extend_from_slice(want.addrs.0.to_string().as_bytes());
    }
    key.into_boxed_slice()
}

/// A parents' pool key `key` for a first hop that leaves from `from`'s addresses: both
/// (`egress::pool_key`), or empty (never pooled) when they change per connection.
fn from_key(key: &[u8], from: &super::Leaving<'_>) -> Box<[u8]> {
    let varies = from.pool_key.is_empty();
    super::egress::pool_key(key, &from.picked, varies)
}

/// Whether a connection through `chain` ends at an HTTP parent that takes this request
/// itself (plain HTTP, no TLS to the target).
fn takes_absolute(want: &Want<'_>, chain: &[&Arc<Parent>]) -> bool {
    chain.last().is_some_and(|p| matches!(p.kind, ParentKind::Http | ParentKind::Https))
        && want.protocol == Protocol::Http
        && matches!(want.tls, Tls::Plain)
}

impl Upstreams {
    /// `start` for a route through parents: the parents picked now, and a pooled
    /// connection through them when there is one (pooled requests need a key: tunnels
    /// are never pooled).
    pub(super) fn start_route<'p>(
        &self,
        policy: &'p Policy,
        want: &Want<'_>,
        key: Option<super::Key<'_>>,
        rules_too: bool,
        (name, hops): (&'p str, &'p [Hop]),
        from: Option<Box<super::Leaving<'p>>>,
    ) -> Result<super::Start<'p>, Error> {
        let chain = pick_chain(policy, want, hops)
            .map_err(|why| Error::Connect(ConnectError::NoParent(why)))?;
        if chain.is_empty() {
            let plan = super::Plan { rules_too, way: super::Way::Direct, from, seed: want.seed };
            return Ok(super::Start::Connect(plan));
        }
        // A first hop from an address that changes per connection: never from the pool.
        let rotates = from.as_ref().is_some_and(|f| f.pool_key.is_empty());
        if key.is_some() && !rotates {
            let absolute = takes_absolute(want, &chain);
            let mut pool_key = pool_key(want, &chain, absolute);
            if let Some(f) = &from {
                pool_key = from_key(&pool_key, f);
            }
            if let Some((stream, addr)) = self.take(self.key(&pool_key)) {
                let last = chain[chain.len() - 1];
                let auth = absolute.then(|| proxy_authorization(last, want.user));
                return Ok(super::Start::Ready(Connected {
                    stream,
                    addr,
                    reused: true,
                    via: Some(via(policy, name, &chain)),
                    pool_key: Some(pool_key),
                    absolute: auth,
                    early: Vec::new(),
                    private: chain[0].proxy_protocol.is_some(),
                }));
            }
        }
        let way = super::Way::Chain { name, hops, chain };
        Ok(super::Start::Connect(super::Plan { rules_too, way, from, seed: want.seed }))
    }
}

/// The `Proxy-Authorization` value for an HTTP parent, if it has credentials.
fn proxy_authorization(p: &Parent, client_user: Option<&str>) -> Option<Box<[u8]>> {
    credentials(p, client_user).map(basic)
}

/// What `p` is sent as credentials: its `user` (or, with `pass_user`, the client's own
/// name) with its password.
fn credentials<'a>(p: &'a Parent, client_user: Option<&'a str>) -> Option<Credentials<'a>> {
    let user = p.user_for(client_user)?;
    let password = p.password.as_ref().map_or("", |s| s.expose());
    Some(Credentials { user, password })
}

/// The handshake a parent of this kind takes (an `https` one inside its TLS).
fn hop_kind(kind: ParentKind) -> HopKind {
    match kind {
        ParentKind::Http | ParentKind::Https => HopKind::Http,
        ParentKind::Socks5 => HopKind::Socks5,
        ParentKind::Socks4a => HopKind::Socks4a,
    }
}

/// `Plan::absolute` for a picked chain.
pub(super) fn absolute(want: &Want<'_>, chain: &[&Arc<Parent>]) -> Option<Option<Box<[u8]>>> {
    let last = chain.last()?;
    takes_absolute(want, chain).then(|| proxy_authorization(last, want.user))
}

impl Upstreams {
    /// Checks `p` as its `probe` says: a TCP connection to it, or a tunnel through it to
    /// the probe's target. The answer counts like a connection's: success brings a parent
    /// that is down back at once, failure counts towards marking it down.
    pub(crate) async fn probe(&self, policy: &Policy, p: &Parent, timeouts: &Timeouts) {
        let Some(probe) = &p.probe else { return };
        let started = Instant::now();
        let result = async {
            let (tcp, _) = self
                .connect_tcp(&p.host, p.port, timeouts.connect, &|_| None, None)
                .await
                .map_err(|e| format!("cannot be reached: {e}"))?;
            let mut stream = Stream::Tcp(tcp);
            // The probe is rustle's own connection: a header without a client (v2 LOCAL,
            // v1 UNKNOWN), so that a parent requiring one takes it.
            if let Some(version) = p.proxy_protocol {
                send_header(&mut stream, version, None, timeouts).await?;
            }
            let crate::config::Probe::Connect(target) = probe else { return Ok(()) };
            if p.kind == ParentKind::Https {
                stream = parent_tls(policy, p, stream, timeouts).await?;
            }
            let creds = credentials(p, None);
            let kind = hop_kind(p.kind);
            hop::tunnel(&mut stream, kind, creds, &target.host, target.port, timeouts.connect)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        let result = result.await;
        p.health.stats.probed(started.elapsed());
        match result {
            Ok(()) => {
                if p.succeeded() {
                    tracing::info!("{p} is up again (probe)");
                }
            }
            Err(why) => {
                if p.failed(Instant::now()) {
                    tracing::warn!("{p} marked down for {:?} (probe): {why}", p.down_for);
                } else {
                    tracing::debug!("{p}: probe failed: {why}");
                }
            }
        }
    }
}

/// A UDP association chained through a SOCKS5 parent's own UDP ASSOCIATE: datagrams keep
/// their SOCKS5 header and go to the parent's relay; its replies come back with theirs.
pub(crate) struct UdpVia {
    /// The TCP connection the parent's association lives by.
    pub(crate) control: Stream,
    /// Where the parent relays datagrams.
    pub(crate) relay: std::net::SocketAddr,
    pub(crate) via: Rc<Via>,
}

impl Upstreams {
    /// Where a UDP association goes: None for direct (no route, or a route to `direct`),
    /// or through the SOCKS5 parent its route names (UDP goes through one SOCKS5 parent,
    /// not a chain, and not through other kinds). The route is chosen on what the client
    /// declared (`want`: often no address at all), before any datagram.
    pub(crate) async fn udp_route(
        &self,
        policy: &Policy,
        want: &Want<'_>,
        timeouts: &Timeouts,
    ) -> Result<Option<UdpVia>, Error> {
        if policy.routes.is_empty() {
            return Ok(None);
        }
        let access = want.access(policy);
        let (route, hops, egress) = match policy.routes.choose(&access.request(None)) {
            crate::policy::route::Choice::Path { route, hops, egress } => (route, hops, egress),
            crate::policy::route::Choice::Deny { route } => {
                let rule = format!("route `{route}`");
                let reason = "the route refuses it";
                return Err(Error::Connect(ConnectError::Denied(crate::policy::Denial {
                    rule,
                    reason,
                })));
            }
            crate::policy::route::Choice::Direct { .. }
            | crate::policy::route::Choice::NeedAddress => return Ok(None),
        };
        let want = &want.seeded(policy, Some(route));
        // The control connection to the parent leaves from the route's address.
        let from = egress.map(|e| super::egress::pick(e, want));
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let chain = match pick_chain(policy, want, hops) {
                Ok(chain) => chain,
                Err(why) => return Err(last.unwrap_or(Error::Connect(ConnectError::NoParent(why)))),
            };
            let p = match chain.as_slice() {
                [] => return Ok(None),
                [p] if p.kind == ParentKind::Socks5 => *p,
                _ => {
                    return Err(Error::Connect(ConnectError::NoParent(format!(
                        "route `{route}`: UDP goes only through one SOCKS5 parent"
                    ))))
                }
            };
            let attempt = async {
                let (tcp, addr) = self
                    .connect_tcp(&p.host, p.port, timeouts.connect, &|_| None, from.as_ref())
                    .await
                    .map_err(|e| {
                        (format!("cannot be reached: {e}"), true, 502, Reply::GeneralFailure)
                    })?;
                let mut control = Stream::Tcp(tcp);
                if let Some(version) = p.proxy_protocol {
                    send_header(
                        &mut control,
                        version,
                        Some((*want.addrs.0, *want.addrs.1)),
                        timeouts,
                    )
                    .await
                    .map_err(|why| (why, true, 502, Reply::GeneralFailure))?;
                }
                let creds = credentials(p, want.user);
                let unknown = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
                let relay = hop::udp_associate(&mut control, creds, unknown, timeouts.connect)
                    .await
                    .map_err(|e| {
                        (e.to_string(), e.parent_failed(), e.status(), e.socks5_reply())
                    })?;
                // An unspecified relay address means the parent's own.
                let relay = match relay.ip().is_unspecified() {
                    true => std::net::SocketAddr::new(addr.ip(), relay.port()),
                    false => relay,
                };
                Ok::<_, (String, bool, u16, Reply)>((control, relay))
            };
            match attempt.await {
                Ok((control, relay)) => {
                    if p.succeeded() {
                        tracing::info!("{p} is up again");
                    }
                    return Ok(Some(UdpVia { control, relay, via: via(policy, route, &chain) }));
                }
                Err((reason, broken, status, reply)) => {
                    let error = parent_error(route, p, reason, status, reply);
                    if !broken {
                        return Err(error);
                    }
                    if p.failed(Instant::now()) {
                        tracing::warn!("{p} marked down for {:?}: {error}", p.down_for);
                    }
                    last = Some(error);
                }
            }
        }
        Err(last.unwrap_or(Error::Connect(ConnectError::NoParent(format!(
            "route `{route}`: no parent answered"
        )))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(text: &str) -> crate::policy::route::Routes {
        let cfg = crate::config::Config::parse(text).expect("valid");
        crate::policy::route::Routes::build(&cfg, &[]).expect("builds")
    }

    const CLIENT: std::net::SocketAddr = std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::new(192, 0, 2, 1),
        40000,
    ));
    const LISTENER: std::net::SocketAddr = std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::new(192, 0, 2, 2),
        3128,
    ));

    fn want<'a>(user: Option<&'a str>) -> Want<'a> {
        Want {
            host: "Origin.example",
            port: 80,
            protocol: Protocol::Http,
            client: std::net::IpAddr::from([192, 0, 2, 1]),
            addrs: (&CLIENT, &LISTENER),
            user,
            listener: None,
            tls: Tls::Plain,
            local: None,
            params: None,
            seed: None,
        }
    }

    #[test]
    fn pool_keys_name_the_parents_the_target_and_a_passed_user() {
        let r = routes(
            "[[parent]]\nname = \"s\"\nkind = \"socks5\"\naddress = \"10.0.0.1:1080\"\n\
             [[parent]]\nname = \"u\"\nkind = \"socks5\"\naddress = \"10.0.0.2:1080\"\n\
             pass_user = true\npassword = \"pw\"\n\
             [[parent]]\nname = \"h\"\nkind = \"http\"\naddress = \"10.0.0.3:3128\"\n",
        );
        let [s, u, h] = [&r.parents()[0], &r.parents()[1], &r.parents()[2]];
        // An HTTP parent takes any target: one key for all.
        assert_eq!(&*pool_key(&want(Some("alice")), &[h], true), b"\0h>");
        // A tunnel: the target, lower-cased.
        assert_eq!(&*pool_key(&want(Some("alice")), &[s], false), b"\0s>origin.example:80");
        assert_eq!(&*pool_key(&want(None), &[h, s], false), b"\0h>s>origin.example:80");
        // Through a parent given the client's name, each user has its own.
        let alice = pool_key(&want(Some("alice")), &[u], false);
        let bob = pool_key(&want(Some("bob")), &[u], false);
        assert_eq!(&*alice, b"\0u>origin.example:80\0alice");
        assert_ne!(alice, bob);
        assert!(takes_absolute(&want(None), &[s, h]) && !takes_absolute(&want(None), &[h, s]));
    }

    #[test]
    fn a_parent_told_the_client_keys_its_connections_by_client() {
        let r = routes(
            "[[parent]]\nname = \"h\"\nkind = \"http\"\naddress = \"10.0.0.3:3128\"\n\
             proxy_protocol = \"v2\"\n",
        );
        let h = &r.parents()[0];
        let one = want(None);
        let next: std::net::SocketAddr = ([192, 0, 2, 1], 40001).into();
        let mut other = want(None);
        other.addrs.0 = &next;
        assert_eq!(&*pool_key(&one, &[h], true), b"\0h>\0client=192.0.2.1:40000");
        assert_ne!(pool_key(&one, &[h], true), pool_key(&other, &[h], true));
    }
}
