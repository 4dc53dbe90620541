//! The upstream layer: every front end (HTTP/1, HTTP/2, SOCKS, the TCP relay) asks it for
//! "a connection to this target, for this client, user, listener and protocol" and gets
//! back a stream and what the log needs. It owns the access check (on the host before
//! anything, on each resolved address before connecting), the per-worker pool of idle
//! origin connections, TLS origination, and, below it, the resolver (`resolve`: hickory
//! behind a per-worker name cache) and Happy Eyeballs (RFC 8305) over every resolved address. Per
//! worker means no lock: each worker owns its cache and its pool.
//!
//! A connection is asked for in two steps, so that the common case costs no allocation:
//! `start` decides (access, route) and takes a pooled connection when there is one;
//! `connect`, the slow path, which a front end boxes and races against its client leaving,
//! makes a new one.

pub mod hop;

use std::cell::{Cell, RefCell};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use hashbrown::HashTable;
use tokio::net::TcpStream;

use crate::acl::Protocol;
use crate::config::Upstream as UpstreamConfig;
use crate::error::{ConnectError, Error};
use crate::io::conn::Stream;
use crate::policy::route::egress::{Egress, Picked};
use crate::policy::route::{Choice, Hop};
use crate::policy::{Access, Denial, Policy};
use crate::telemetry::accesslog::Via;

mod egress;
mod parents;
mod resolve;

pub(crate) use egress::UdpFrom;
pub(crate) use parents::UdpVia;

/// Who asks for a connection to where.
#[derive(Clone, Copy)]
pub(crate) struct Want<'a> {
    /// The destination host as the client named it (a name or an address literal).
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) protocol: Protocol,
    pub(crate) client: IpAddr,
    /// The client's address and port (the ones a PROXY protocol header carried) and the
    /// listener's address, for a PROXY protocol header to a parent or a relay target.
    /// (References: a `Want` lives in every connection's future.)
    pub(crate) addrs: (&'a SocketAddr, &'a SocketAddr),
    /// The authenticated user, if any.
    pub(crate) user: Option<&'a str>,
    /// The listener's name, if it has one.
    pub(crate) listener: Option<&'a str>,
    pub(crate) tls: Tls<'a>,
    /// The local address the client connected to: only when a route binds to `same`
    /// (`Routes::needs_local`), None otherwise.
    pub(crate) local: Option<IpAddr>,
    /// The parameters of the user name (`alice-country-de`), if it had any.
    pub(crate) params: Option<&'a crate::acl::Params>,
    /// Makes the picks of one connection (a group's member, the outgoing address) a
    /// function of it: the same seed, the same picks. A front end gives None; the route's
    /// sticky session fills it in (`Routes::seed`).
    pub(crate) seed: Option<u64>,
}

/// TLS on top of the connection to the target.
#[derive(Clone, Copy)]
pub enum Tls<'a> {
    Plain,
    /// An `https://` origin: verified against `[tls] origin_ca` or the system's roots, the
    /// host sent as SNI.
    Origin,
    /// A relay listener's `target_tls` (its TLS config in the policy under its key),
    /// after a PROXY protocol header in clear when it has `target_proxy_protocol`.
    Relay {
        listener: &'a crate::config::Listener,
    },
}

/// A connection ready for use, and what the log says of it.
pub(crate) struct Connected {
    pub(crate) stream: Stream,
    /// The address connected to.
    pub(crate) addr: SocketAddr,
    /// Taken from the pool (it may turn out dead; see the exchange's retry).
    pub(crate) reused: bool,
    /// The route and parents taken; None for a direct connection.
    pub(crate) via: Option<Rc<Via>>,
    /// The pool key of a connection through parents (their names, and the target unless
    /// the last parent takes requests for any) or from a route's chosen address (the
    /// caller's key and that address); None: the caller's own key. Empty: never pooled
    /// (its route draws a new address per connection).
    pub(crate) pool_key: Option<Box<[u8]>>,
    /// The last parent is an HTTP proxy that takes this plain HTTP request itself: send
    /// it in absolute form, with this `Proxy-Authorization` value when there is one.
    pub(crate) absolute: Option<Option<Box<[u8]>>>,
    /// Bytes the last parent sent after its reply, which belong to the tunnel.
    pub(crate) early: Vec<u8>,
    /// The first parent was sent a PROXY protocol header naming this client: the
    /// connection is this client connection's alone (pinned, `exchange::Pinned`, and
    /// closed with it), never another's.
    pub(crate) private: bool,
}

impl Connected {
    fn direct(stream: Stream, addr: SocketAddr, reused: bool) -> Connected {
        Connected {
            stream,
            addr,
            reused,
            via: None,
            pool_key: None,
            absolute: None,
            early: Vec::new(),
            private: false,
        }
    }
}

/// What `start` decided when no pooled connection would do.
pub(crate) struct Plan<'p> {
    /// The rules need each resolved address (a rule with `destinations` matched so far).
    rules_too: bool,
    way: Way<'p>,
    /// Where the connection leaves from, when its route says (`bind`, `interface`).
    from: Option<Box<Leaving<'p>>>,
    /// The route's sticky seed (`Want::seed` for the connection made).
    seed: Option<u64>,
}

/// A route's outgoing addresses for one connection, and the pool key that goes with them
/// (`egress::pool_key`). Boxed in a plan: only routes with `bind` carry one.
struct Leaving<'p> {
    picked: crate::policy::route::egress::Picked<'p>,
    pool_key: Box<[u8]>,
}

enum Way<'p> {
    Direct,
    /// Through the hops of a route.
    Route {
        name: &'p str,
        hops: &'p [Hop],
    },
    /// Through the hops of a route, the parents of its first attempt already picked.
    Chain {
        name: &'p str,
        hops: &'p [Hop],
        chain: Vec<&'p std::sync::Arc<crate::policy::route::Parent>>,
    },
    /// A route's `destinations` decide: resolve first.
    Undecided,
}

/// `start`'s answer.
pub(crate) enum Start<'p> {
    Ready(Connected),
    Connect(Plan<'p>),
}

impl Plan<'_> {
    /// Whether the route is decided only by resolving the target (`settle` first).
    pub(crate) fn undecided(&self) -> bool {
        matches!(self.way, Way::Undecided)
    }

    /// How a plain HTTP request goes on the connection this plan makes: None to its
    /// origin; in absolute form to an HTTP parent, with that parent's
    /// `Proxy-Authorization` value when it has credentials.
    pub(crate) fn absolute(&self, want: &Want<'_>) -> Option<Option<Box<[u8]>>> {
        match &self.way {
            Way::Chain { chain, .. } => parents::absolute(want, chain),
            Way::Direct | Way::Route { .. } | Way::Undecided => None,
        }
    }
}

impl<'a> Want<'a> {
    /// The access rules on this request before any address is known: Ok(true) when they
    /// need the address (`check`).
    pub(crate) fn precheck(&self, policy: &Policy) -> Result<bool, Denial> {
        self.access(policy).precheck()
    }

    /// The built-in protections and the rules on connecting (or sending) to `addr`.
    pub(crate) fn check(&self, policy: &Policy, addr: SocketAddr) -> Option<Denial> {
        let access = self.access(policy);
        match access.precheck() {
            Ok(rules_too) => access.check_addr(addr, rules_too),
            Err(d) => Some(d),
        }
    }

    /// This request with the seed of its sticky session on `route` (`Routes::seed`),
    /// unless it has one already.
    pub(crate) fn seeded(&self, policy: &Policy, route: Option<&str>) -> Want<'a> {
        let seed = self
            .seed
            .or_else(|| policy.routes.seed(route?, self.user, self.params, crate::limits::now()));
        Want { seed, ..*self }
    }

    /// The access decision's view of this request.
    fn access(&self, policy: &'a Policy) -> Access<'a> {
        // Rules and routes are the only readers of the user's groups: no lookup when there
        // are none.
        let user = match policy.rules.is_empty() && policy.routes.is_empty() {
            true => None,
            false => self.user.and_then(|u| crate::policy::UserView::of(policy, u)),
        };
        Access {
            policy,
            listener: self.listener,
            client: self.client,
            user,
            host: self.host,
            port: self.port,
            protocol: self.protocol,
            params: self.params,
        }
    }
}

/// The outgoing address a backend granted `want`'s user, pooled under `key` and it; None
/// without backends, for a users-file user, or with no grant of one.
fn granted_egress<'p>(
    policy: &Policy,
    want: &Want<'_>,
    key: Option<Key<'_>>,
) -> Option<Box<Leaving<'p>>> {
    if policy.backends.is_empty() {
        return None;
    }
    let ip = crate::policy::auth::identity::egress(want.user?, &policy.backends)?;
    // A users-file user is never a backend's (its name may be a stale grant's).
    if policy.users.get(want.user?).is_some() {
        return None;
    }
    let local = Some(crate::policy::route::egress::Local { ip, freebind: false });
    let (v4, v6) = match ip {
        IpAddr::V4(_) => (local, None),
        IpAddr::V6(_) => (None, local),
    };
    let picked =
        crate::policy::route::egress::Picked { v4, v6, only: true, interface: None, route: "" };
    let base = key.map(|k| k.bytes).unwrap_or_default();
    Some(Box::new(Leaving { pool_key: egress::pool_key(base, &picked, false), picked }))
}

/// The outgoing addresses route `e` picks for `want`, pooled under `base` and them.
fn leaving<'p>(e: &'p Egress, want: &Want<'_>, base: &[u8]) -> Box<Leaving<'p>> {
    let picked = egress::pick(e, want);
    let varies = base.is_empty() || e.varies(want.seed);
    Box::new(Leaving { pool_key: egress::pool_key(base, &picked, varies), picked })
}

/// The local address a client connected to, when a route binds to `same`
/// (`Routes::needs_local`); None, with no system call, otherwise.
pub(crate) fn local_of(
    policy: &Policy,
    local_addr: impl FnOnce() -> io::Result<SocketAddr>,
) -> Option<IpAddr> {
    if !policy.routes.needs_local() {
        return None;
    }
    local_addr().ok().map(|a| a.ip())
}

/// `local_of` for a UDP listener's socket: its own address unless it is the wildcard.
pub(crate) fn local_of_udp(policy: &Policy, socket: &tokio::net::UdpSocket) -> Option<IpAddr> {
    if !policy.routes.needs_local() {
        return None;
    }
    socket.local_addr().ok().map(|a| a.ip()).filter(|ip| !ip.is_unspecified())
}

/// The route a choice names, if any (for its sticky session).
fn route_of<'c>(choice: &Choice<'c>) -> Option<&'c str> {
    match *choice {
        Choice::Direct { route, .. } => route,
        Choice::Path { route, .. } => Some(route),
        Choice::Deny { .. } | Choice::NeedAddress => None,
    }
}

fn denied(d: Denial) -> Error {
    Error::Connect(ConnectError::Denied(d))
}

impl Upstreams {
    /// A connection from a chosen address: pooled under a key naming it, or not at all
    /// when the address changes per connection.
    fn start_from<'p>(
        &self,
        access: &Access<'_>,
        key: Option<Key<'_>>,
        from: Box<Leaving<'p>>,
        rules_too: bool,
        seed: Option<u64>,
    ) -> Start<'p> {
        if let (Some(_), false) = (key, from.pool_key.is_empty()) {
            while let Some((mut stream, addr)) = self.take(self.key(&from.pool_key)) {
                if access.check_addr(addr, rules_too).is_none() {
                    let mut c = Connected::direct(stream, addr, true);
                    c.pool_key = Some(from.pool_key);
                    return Start::Ready(c);
                }
                stream.close_now();
            }
        }
        Start::Connect(Plan { rules_too, way: Way::Direct, from: Some(from), seed })
    }

    /// The first step: the access rules on the host, then a pooled connection under `key`
    /// whose address the rules allow, if there is one.
    pub(crate) fn start<'p>(
        &self,
        policy: &'p Policy,
        want: &Want<'_>,
        key: Option<Key<'_>>,
    ) -> Result<Start<'p>, Error> {
        let access = want.access(policy);
        let rules_too = access.precheck().map_err(denied)?;
        // No route: the direct path does nothing more.
        let mut seed = want.seed;
        if !policy.routes.is_empty() {
            let choice = policy.routes.choose(&access.request(None));
            let want = &want.seeded(policy, route_of(&choice));
            seed = want.seed;
            let (way, egress) = match choice {
                Choice::Direct { egress, .. } => (Way::Direct, egress),
                Choice::Deny { route } => {
                    let rule = format!("route `{route}`");
                    return Err(denied(Denial { rule, reason: "the route refuses it" }));
                }
                Choice::NeedAddress => (Way::Undecided, None),
                Choice::Path { route, hops, egress } => (Way::Route { name: route, hops }, egress),
            };
            let from = egress.map(|e| leaving(e, want, key.map(|k| k.bytes).unwrap_or_default()));
            if let Way::Route { name, hops } = way {
                return self.start_route(policy, want, key, rules_too, (name, hops), from);
            }
            if !matches!(way, Way::Direct) {
                return Ok(Start::Connect(Plan { rules_too, way, from, seed }));
            }
            if let Some(from) = from {
                return Ok(self.start_from(&access, key, from, rules_too, seed));
            }
        }
        // The outgoing address an external backend granted the user (RADIUS
        // Framed-IP-Address, the callback's `egress`), when no route chose one.
        if let Some(from) = granted_egress(policy, want, key) {
            return Ok(self.start_from(&access, key, from, rules_too, seed));
        }
        if let Some(key) = key {
            while let Some((mut stream, addr)) = self.take(key) {
                if access.check_addr(addr, rules_too).is_none() {
                    return Ok(Start::Ready(Connected::direct(stream, addr, true)));
                }
                stream.close_now();
            }
        }
        Ok(Start::Connect(Plan { rules_too, way: Way::Direct, from: None, seed }))
    }

    /// The second step: a new connection as `plan` says, within the connect timeout, with
    /// TLS on top as `want` asks (within the handshake timeout). The time it took goes to
    /// the metrics.
    pub(crate) fn connect<'s, 'w>(
        &'s self,
        policy: &'s Policy,
        want: &'s Want<'w>,
        plan: Plan<'s>,
        timeouts: &'s crate::config::Timeouts,
    ) -> impl std::future::Future<Output = Result<Connected, Error>> + use<'s, 'w> {
        // Timed only while something reads the durations (`metrics::timed`). Not an async
        // fn: its future would hold its arguments beside `make`'s own.
        let started = crate::telemetry::metrics::timed().then(std::time::Instant::now);
        futures_util::FutureExt::map(self.make(policy, want, plan, timeouts), move |connected| {
            if let (Ok(_), Some(started)) = (&connected, started) {
                crate::telemetry::metrics::upstream_connected(started.elapsed());
            }
            connected
        })
    }

    async fn make(
        &self,
        policy: &Policy,
        want: &Want<'_>,
        mut plan: Plan<'_>,
        timeouts: &crate::config::Timeouts,
    ) -> Result<Connected, Error> {
        // The plan is updated in place: new bindings of its parts would sit in this
        // future beside it (it is boxed per new connection: kept small, it stays in the
        // allocator's per-thread cache).
        if let Way::Undecided = plan.way {
            let (way, egress, seed) = self.decide(policy, want).await?;
            // Decided by the target's addresses, after the caller's pool key was given
            // up: never pooled.
            let want = &Want { seed, ..*want };
            plan.from = egress.map(|e| leaving(e, want, b""));
            (plan.way, plan.seed) = (way, seed);
        }
        // Through parents: boxed, so that a direct connection's future does not carry a
        // chain's handshakes, nor the request's copy with its seed (the direct path needs
        // no seed: its outgoing address is picked already).
        let Plan { rules_too, way, from, seed } = plan;
        let (route, first) = match way {
            Way::Route { name, hops } => ((name, hops), None),
            Way::Chain { name, hops, chain } => ((name, hops), Some(chain)),
            Way::Direct | Way::Undecided => {
                return self.direct(policy, want, rules_too, timeouts, from.as_deref()).await
            }
        };
        let seeded = Want { seed, ..*want };
        Box::pin(async move {
            let first = (first, from.as_deref());
            self.through(policy, &seeded, rules_too, route, first, timeouts).await
        })
        .await
    }

    /// Settles a plan that `undecided` says the target's addresses decide: resolved now,
    /// so that the caller knows where the request goes before it writes it.
    pub(crate) async fn settle<'p>(
        &self,
        policy: &'p Policy,
        want: &Want<'_>,
        plan: &mut Plan<'p>,
    ) -> Result<(), Error> {
        let Way::Undecided = plan.way else { return Ok(()) };
        let (way, egress, seed) = self.decide(policy, want).await?;
        let want = &Want { seed, ..*want };
        // Decided by the target's addresses: never pooled (see `make`).
        plan.from = egress.map(|e| leaving(e, want, b""));
        plan.seed = seed;
        let way = match way {
            Way::Route { name, hops } => {
                let chain = parents::pick_chain(policy, want, hops)
                    .map_err(|why| Error::Connect(ConnectError::NoParent(why)))?;
                match chain.is_empty() {
                    true => Way::Direct,
                    false => Way::Chain { name, hops, chain },
                }
            }
            way => way,
        };
        (plan.way, plan.seed) = (way, seed);
        Ok(())
    }

    /// A route whose `destinations` decide: the target is resolved (through the cache)
    /// and the first address that settles the choice does; with the seed of the chosen
    /// route's sticky session.
    async fn decide<'p>(
        &self,
        policy: &'p Policy,
        want: &Want<'_>,
    ) -> Result<(Way<'p>, Option<&'p Egress>, Option<u64>), Error> {
        let access = want.access(policy);
        let ips = self.resolve(access.host).await.map_err(Error::Connect)?;
        for ip in ips.iter() {
            let choice = policy.routes.choose(&access.request(Some(*ip)));
            let seed = want.seeded(policy, route_of(&choice)).seed;
            match choice {
                Choice::Direct { egress, .. } => return Ok((Way::Direct, egress, seed)),
                Choice::Deny { route } => {
                    let rule = format!("route `{route}`");
                    return Err(denied(Denial { rule, reason: "the route refuses it" }));
                }
                Choice::Path { route, hops, egress } => {
                    return Ok((Way::Route { name: route, hops }, egress, seed))
                }
                Choice::NeedAddress => {}
            }
        }
        Ok((Way::Direct, None, want.seed))
    }

    /// A direct connection to the target, each resolved address vetted by the rules.
    async fn direct(
        &self,
        policy: &Policy,
        want: &Want<'_>,
        rules_too: bool,
        timeouts: &crate::config::Timeouts,
        from: Option<&Leaving<'_>>,
    ) -> Result<Connected, Error> {
        // The access view is made per address checked (one, most often), not kept in this
        // future while it connects.
        let filter = |addr| want.access(policy).check_addr(addr, rules_too);
        let (host, port) = (want.host, want.port);
        let picked = from.map(|f| &f.picked);
        let (tcp, addr) = self.connect_tcp(host, port, timeouts.connect, &filter, picked).await?;
        let stream = match want.tls {
            Tls::Plain => Stream::Tcp(tcp),
            // Boxed: a handshake's state would otherwise make every new connection's
            // future (a tunnel's included) several times larger while it connects.
            _ => Box::pin(target_tls(policy, want, Stream::Tcp(tcp), addr, timeouts)).await?,
        };
        let mut c = Connected::direct(stream, addr, false);
        c.pool_key = from.map(|f| f.pool_key.clone());
        Ok(c)
    }
}

/// A PROXY protocol header from `addrs` (client, the address it connected to); None:
/// v1 `UNKNOWN`, v2 `LOCAL` (a connection of rustle's own, such as a probe).
pub(crate) fn proxy_header(
    version: crate::config::ProxyProtocol,
    addrs: Option<(SocketAddr, SocketAddr)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    match version {
        crate::config::ProxyProtocol::V1 => rustle_proto::proxy_protocol::write_v1(addrs, &mut out),
        _ => rustle_proto::proxy_protocol::write_v2(addrs, &mut out),
    }
    out
}

/// Writes `bytes` on a new upstream connection before anything else, within `timeout`.
async fn write_first(stream: &mut Stream, bytes: &[u8], timeout: Duration) -> io::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    match tokio::time::timeout(timeout, stream.write_all(bytes)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")),
    }
}

/// TLS to the target on top of `stream`, as `want` asks.
async fn target_tls(
    policy: &Policy,
    want: &Want<'_>,
    mut stream: Stream,
    addr: SocketAddr,
    timeouts: &crate::config::Timeouts,
) -> Result<Stream, Error> {
    let tls_error = |reason: String| Error::Connect(ConnectError::Tls { addr, reason });
    let host = want.host;
    let (config, name) = match want.tls {
        Tls::Plain => return Ok(stream),
        Tls::Origin => {
            let config = policy.https_origins().map_err(|e| tls_error(e.to_string()))?.clone();
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|_| tls_error(format!("`{host}` is not a server name")))?;
            (config, name)
        }
        Tls::Relay { listener } => {
            let (Some(settings), Some(config)) =
                (&listener.target_tls, policy.tls_connector(&listener.key).cloned())
            else {
                return Err(tls_error("the listener has no TLS settings for its target".into()));
            };
            if let Some(version) = listener.target_proxy_protocol {
                let header = proxy_header(version, Some((*want.addrs.0, *want.addrs.1)));
                write_first(&mut stream, &header, timeouts.handshake)
                    .await
                    .map_err(|e| tls_error(format!("sending the PROXY protocol header: {e}")))?;
            }
            (config, crate::io::tls::server_name(settings, host).map_err(tls_error)?)
        }
    };
    crate::io::tls::connect_over(config, name, stream, timeouts.handshake).await.map_err(tls_error)
}

/// RFC 8305's recommended Connection Attempt Delay: how long one address gets before the
/// next is tried in parallel.
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

struct Idle {
    stream: Stream,
    addr: SocketAddr,
    since: Instant,
}

/// A worker's view of the upstream side.
pub(crate) struct Upstreams {
    /// Pool and name-cache settings; a reload replaces them (`set_config`).
    cfg: RefCell<UpstreamConfig>,
    /// The resolver and its cache; a reload that changes `[dns]` replaces it.
    dns: RefCell<Rc<resolve::Resolver>>,
    pool: RefCell<Pool>,
    /// The pool's clock: the worker's housekeeping tick sets it (`tick`, every
    /// `idle::TICK`), so taking and parking a connection read no clock. An idle
    /// connection's age is known to a tick or two, well inside `pool_idle_timeout`.
    now: Cell<Instant>,
}

struct Pool {
    /// By the lowercased `host:port` the client named (or a route's key), each entry
    /// under its key's hash (`Key`).
    table: HashTable<Entry>,
    /// The keys' hasher: seeded per worker, so keys an attacker picks collide no more
    /// often than chance.
    hasher: foldhash::fast::RandomState,
    total: usize,
}

struct Entry {
    hash: u64,
    key: Box<[u8]>,
    idle: Vec<Idle>,
}

/// A pool key with its hash (`Upstreams::key`). A client connection that keeps its key
/// from request to request keeps the hash too (`Key::hashed`), so that taking and parking
/// a connection hash nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key<'a> {
    pub(crate) bytes: &'a [u8],
    hash: u64,
}

impl<'a> Key<'a> {
    /// `bytes` with the hash `Upstreams::key` gave it before, on this worker.
    pub(crate) fn hashed(bytes: &'a [u8], hash: u64) -> Self {
        Key { bytes, hash }
    }

    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }
}

impl Upstreams {
    /// `system`: the files the resolver reads, as the policy read them.
    pub(crate) fn new(
        cfg: UpstreamConfig,
        dns: crate::config::Dns,
        system: std::sync::Arc<crate::policy::dns::System>,
    ) -> Self {
        Upstreams {
            cfg: RefCell::new(cfg),
            dns: RefCell::new(Rc::new(resolve::Resolver::new(dns, system))),
            pool: RefCell::new(Pool {
                table: HashTable::new(),
                hasher: foldhash::fast::RandomState::default(),
                total: 0,
            }),
            now: Cell::new(Instant::now()),
        }
    }

    /// The housekeeping tick's time, the pool's clock from now on.
    pub(crate) fn tick(&self, now: Instant) {
        self.now.set(now);
    }

    /// The pool and name-cache settings from now on (a reload).
    pub(crate) fn set_config(
        &self,
        cfg: UpstreamConfig,
        dns: &crate::config::Dns,
        system: &std::sync::Arc<crate::policy::dns::System>,
    ) {
        *self.cfg.borrow_mut() = cfg;
        if !self.dns.borrow().same(dns, system) {
            // New servers, hosts, bounds or files: a fresh resolver and an empty cache.
            // Lookups in flight finish on the old one.
            *self.dns.borrow_mut() = Rc::new(resolve::Resolver::new(dns.clone(), system.clone()));
        }
    }

    /// Resolves `host` (an IP literal costs nothing) through the cache.
    pub(crate) async fn resolve(&self, host: &str) -> Result<Rc<[IpAddr]>, ConnectError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Rc::from([ip]));
        }
        // The resolver is cloned out (a reference count) so that a reload may replace it
        // while this lookup runs.
        let resolver = self.dns.borrow().clone();
        resolver.resolve(host).await.map_err(|reason| ConnectError::Resolve {
            host: host.into(),
            reason: reason.to_string(),
        })
    }

    /// Resolves and connects with Happy Eyeballs, all within `timeout`. `check` vets each
    /// resolved address before any connection attempt (access rules on the address really
    /// connected to, so a name cannot smuggle a forbidden address past them). With
    /// `from`, only addresses of the families it has an outgoing address for are tried,
    /// each from that address.
    pub(crate) async fn connect_tcp(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
        check: &dyn Fn(SocketAddr) -> Option<Denial>,
        from: Option<&Picked<'_>>,
    ) -> Result<(TcpStream, SocketAddr), ConnectError> {
        let fut = async {
            let ips = self.resolve(host).await?;
            // In a block of its own: what only this step uses is not kept beside the
            // connection attempts below.
            let mut allowed = {
                let mut allowed: Vec<IpAddr> = Vec::with_capacity(ips.len());
                let mut denied = None;
                for ip in ips.iter() {
                    match check(SocketAddr::new(*ip, port)) {
                        None => allowed.push(*ip),
                        Some(d) => denied = denied.or(Some(d)),
                    }
                }
                drop(ips);
                if let (true, Some(d)) = (allowed.is_empty(), denied) {
                    return Err(ConnectError::Denied(d));
                }
                allowed
            };
            if let Some(picked) = from {
                allowed = egress::usable(allowed, picked, host)?;
            }
            happy_eyeballs(&allowed, port, from).await
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout(format!("{host}:{port}"))),
        }
    }

    /// `bytes` as a pool key, hashed.
    pub(crate) fn key<'a>(&self, bytes: &'a [u8]) -> Key<'a> {
        use std::hash::BuildHasher as _;
        Key { bytes, hash: self.pool.borrow().hasher.hash_one(bytes) }
    }

    /// Takes the most recently used live idle connection for `key`, if any.
    pub(crate) fn take(&self, key: Key<'_>) -> Option<(Stream, SocketAddr)> {
        let mut pool = self.pool.borrow_mut();
        let Pool { table, total, .. } = &mut *pool;
        let entry = table.find_mut(key.hash, |e| *e.key == *key.bytes)?;
        let deadline = self.now.get().checked_sub(self.cfg.borrow().pool_idle_timeout);
        while let Some(mut idle) = entry.idle.pop() {
            *total -= 1;
            let expired = deadline.is_some_and(|d| idle.since < d);
            if !expired && !is_stale(idle.stream.socket()) {
                return Some((idle.stream, idle.addr));
            }
            idle.stream.close_now();
        }
        None
    }

    /// Parks a connection whose last exchange ended cleanly.
    /// A connection the pool has no room for is closed (a TLS one with close_notify).
    /// An empty key is a connection never to be pooled (`Connected::pool_key`).
    pub(crate) fn put(&self, key: Key<'_>, mut stream: Stream, addr: SocketAddr) {
        let mut pool = self.pool.borrow_mut();
        let cfg = self.cfg.borrow();
        let Pool { table, total, .. } = &mut *pool;
        let max = cfg.pool_max_idle_per_host;
        if *total >= cfg.pool_max_idle || max == 0 || key.bytes.is_empty() {
            stream.close_now();
            return;
        }
        let idle = Idle { stream, addr, since: self.now.get() };
        match table.find_mut(key.hash, |e| *e.key == *key.bytes) {
            Some(entry) if entry.idle.len() >= max => {
                let mut idle = idle;
                idle.stream.close_now();
                return;
            }
            Some(entry) => entry.idle.push(idle),
            None => {
                let entry = Entry { hash: key.hash, key: key.bytes.into(), idle: vec![idle] };
                table.insert_unique(key.hash, entry, |e| e.hash);
            }
        }
        *total += 1;
    }

    /// Closes idle connections past their timeout or closed by their origin, and drops
    /// the name cache's expired answers; run from the worker's housekeeping timer so idle
    /// sockets do not linger.
    pub(crate) fn sweep(&self) {
        self.dns.borrow().sweep(self.now.get());
        let mut pool = self.pool.borrow_mut();
        let Some(deadline) = self.now.get().checked_sub(self.cfg.borrow().pool_idle_timeout) else {
            return;
        };
        let Pool { table, total, .. } = &mut *pool;
        table.retain(|e| {
            e.idle.retain_mut(|i| {
                let keep = i.since >= deadline && !is_stale(i.stream.socket());
                if !keep {
                    i.stream.close_now();
                }
                keep
            });
            !e.idle.is_empty()
        });
        *total = table.iter().map(|e| e.idle.len()).sum();
    }

    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.pool.borrow().total
    }

    /// Drops every idle connection (on shutdown).
    pub(crate) fn clear(&self) {
        let mut pool = self.pool.borrow_mut();
        for entry in pool.table.drain() {
            for mut idle in entry.idle {
                idle.stream.close_now();
            }
        }
        pool.total = 0;
    }
}

/// An idle origin connection that has become readable has either closed or sent bytes
/// nobody asked for; both make it unusable (for TLS too: the byte looked at is lost, but
/// the connection is dropped anyway). The check reads tokio's cached readiness, so
/// it costs no syscall unless readiness is set.
/// (Origin connections are always registered; one that is not counts as stale.)
pub(crate) fn is_stale(stream: Option<&TcpStream>) -> bool {
    let Some(stream) = stream else { return true };
    // `try_read` looks at tokio's cached readiness first and returns at once while it is
    // clear (no syscall, no waker stored). Readiness may be left over from a read that
    // exactly filled the buffer: the read then finds nothing and clears it.
    let mut byte = [0u8; 1];
    !matches!(stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// Orders addresses by alternating families, starting with the resolver's first choice.
fn interleave(ips: &[IpAddr]) -> Vec<IpAddr> {
    let first_v6 = ips.first().is_some_and(IpAddr::is_ipv6);
    let (mut a, mut b): (Vec<IpAddr>, Vec<IpAddr>) =
        ips.iter().partition(|ip| ip.is_ipv6() == first_v6);
    a.reverse();
    b.reverse();
    let mut out = Vec::with_capacity(ips.len());
    while !a.is_empty() || !b.is_empty() {
        out.extend(a.pop());
        out.extend(b.pop());
    }
    out
}

async fn connect_one(
    addr: SocketAddr,
    from: Option<&Picked<'_>>,
) -> Result<(TcpStream, SocketAddr), ConnectError> {
    let stream = match from {
        None => TcpStream::connect(addr).await.map_err(|e| ConnectError::from_io(addr, e))?,
        // Boxed: a bound socket's connect future would enlarge every new connection's.
        Some(picked) => Box::pin(egress::connect(addr, picked)).await?,
    };
    // Proxied exchanges are request/response: never let Nagle hold back a small write.
    stream.set_nodelay(true).map_err(|e| ConnectError::from_io(addr, e))?;
    Ok((stream, addr))
}

async fn happy_eyeballs(
    ips: &[IpAddr],
    port: u16,
    from: Option<&Picked<'_>>,
) -> Result<(TcpStream, SocketAddr), ConnectError> {
    if let [ip] = ips {
        return connect_one(SocketAddr::new(*ip, port), from).await;
    }
    // Boxed: its attempts, timer and order would otherwise enlarge every new connection's
    // future, a single address's too.
    Box::pin(happy_eyeballs_many(ips, port, from)).await
}

async fn happy_eyeballs_many(
    ips: &[IpAddr],
    port: u16,
    from: Option<&Picked<'_>>,
) -> Result<(TcpStream, SocketAddr), ConnectError> {
    let order = interleave(ips);
    let mut next = order.iter().map(|ip| SocketAddr::new(*ip, port));
    let mut attempts = FuturesUnordered::new();
    let mut last_err = None;
    if let Some(addr) = next.next() {
        attempts.push(connect_one(addr, from));
    }
    loop {
        let delay = tokio::time::sleep(ATTEMPT_DELAY);
        tokio::select! {
            res = attempts.next() => match res {
                Some(Ok(ok)) => return Ok(ok),
                Some(Err(e)) => {
                    last_err = Some(e);
                    if let Some(addr) = next.next() {
                        attempts.push(connect_one(addr, from));
                    } else if attempts.is_empty() {
                        break;
                    }
                }
                None => break,
            },
            _ = delay => {
                if let Some(addr) = next.next() {
                    attempts.push(connect_one(addr, from));
                }
            }
        }
    }
    Err(last_err.unwrap_or_else(|| ConnectError::Resolve {
        host: String::new(),
        reason: "no addresses".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reload_that_changes_dns_replaces_the_resolver_and_only_then() {
        let mut dns = crate::config::Dns::default();
        dns.hosts.insert("a.test".into(), vec!["192.0.2.1".parse().expect("ip")]);
        let system = std::sync::Arc::new(crate::policy::dns::System::default());
        let ups = Upstreams::new(UpstreamConfig::default(), dns.clone(), system.clone());
        assert_eq!(
            &*ups.resolve("a.test").await.expect("static"),
            &["192.0.2.1".parse::<IpAddr>().expect("ip")]
        );
        let before = ups.dns.borrow().clone();
        ups.set_config(UpstreamConfig::default(), &dns, &system);
        assert!(Rc::ptr_eq(&before, &ups.dns.borrow()), "same [dns]: same resolver and cache");
        let reread = std::sync::Arc::new(crate::policy::dns::System::default());
        ups.set_config(UpstreamConfig::default(), &dns, &reread);
        assert!(Rc::ptr_eq(&before, &ups.dns.borrow()), "files read again, unchanged: same");
        dns.hosts.insert("a.test".into(), vec!["192.0.2.2".parse().expect("ip")]);
        ups.set_config(UpstreamConfig::default(), &dns, &system);
        assert!(!Rc::ptr_eq(&before, &ups.dns.borrow()));
        let before = ups.dns.borrow().clone();
        let hosts =
            crate::policy::dns::System { hosts: "192.0.2.7 b.test\n".into(), ..Default::default() };
        ups.set_config(UpstreamConfig::default(), &dns, &std::sync::Arc::new(hosts));
        assert!(!Rc::ptr_eq(&before, &ups.dns.borrow()), "an edited /etc/hosts: a new resolver");
        assert_eq!(
            &*ups.resolve("b.test").await.expect("hosts"),
            &["192.0.2.7".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(
            &*ups.resolve("a.test").await.expect("static"),
            &["192.0.2.2".parse::<IpAddr>().expect("ip")]
        );
        // A literal never reaches the resolver.
        assert_eq!(ups.resolve("::1").await.expect("literal").len(), 1);
    }

    #[test]
    fn interleaves_families() {
        let v6a: IpAddr = "::1".parse().expect("ip");
        let v6b: IpAddr = "::2".parse().expect("ip");
        let v4a: IpAddr = "127.0.0.1".parse().expect("ip");
        let v4b: IpAddr = "127.0.0.2".parse().expect("ip");
        assert_eq!(interleave(&[v6a, v6b, v4a, v4b]), vec![v6a, v4a, v6b, v4b]);
        assert_eq!(interleave(&[v4a, v6a, v4b]), vec![v4a, v6a, v4b]);
    }

    #[tokio::test]
    async fn happy_eyeballs_skips_a_dead_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // ::1 on that port is (almost certainly) closed: refused fast, then 127.0.0.1 wins.
        let ips: Vec<IpAddr> = vec!["::1".parse().expect("ip"), "127.0.0.1".parse().expect("ip")];
        let (_, addr) = happy_eyeballs(&ips, port, None).await.expect("connects");
        assert_eq!(addr.ip().to_string(), "127.0.0.1");
    }

    #[tokio::test]
    async fn pool_drops_connections_the_origin_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ups = Upstreams::new(UpstreamConfig::default(), Default::default(), Default::default());
        let a = TcpStream::connect(addr).await.expect("connect");
        let (server_a, _) = listener.accept().await.expect("accept");
        let b = TcpStream::connect(addr).await.expect("connect");
        let (_server_b, _) = listener.accept().await.expect("accept");
        // a's origin closes; once its end has arrived (the pool's staleness check looks
        // for it), both are parked.
        drop(server_a);
        tokio::time::timeout(Duration::from_secs(5), a.readable())
            .await
            .expect("the origin's close arrives")
            .expect("readable");
        ups.put(ups.key(b"k:1"), a.into(), addr);
        ups.put(ups.key(b"k:1"), b.into(), addr);
        assert_eq!(ups.idle_count(), 2);
        // b is newest, so it comes first and is alive.
        assert!(ups.take(ups.key(b"k:1")).is_some());
        // a was closed by its origin: not handed out.
        assert!(ups.take(ups.key(b"k:1")).is_none());
        assert_eq!(ups.idle_count(), 0);
    }
}
