//! The upstream side of a route's outgoing addresses: the draw for one connection (a
//! sticky seed, or this worker's turn and random bits: per thread, so no lock), the pool
//! key of a connection that leaves from a chosen address, and the socket it connects from.
//!
//! Pooling: a route whose address varies per connection (a prefix, or a list of more than
//! one address of a family, with no sticky seed) neither takes from the pool nor puts into
//! it, so that each request leaves from an address of its own (rotation per request, even
//! on a kept-alive client connection). A route with one address per family, `same`, or a
//! seeded pick pools its connections under a key that carries the addresses picked, so
//! that a connection from one address never serves a request that asked for another.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};

use tokio::net::TcpStream;

use super::Want;
use crate::error::ConnectError;
use crate::policy::route::egress::{mix, Draw, Egress, Local, Picked};

thread_local! {
    /// This worker's random state (splitmix64), seeded from the OS's randomness (the
    /// standard hasher's keys) once per thread.
    static STATE: Cell<u64> = Cell::new({
        use std::hash::BuildHasher as _;
        std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
    });
    /// Each route's round-robin turn on this worker, by route position.
    static TURNS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn random() -> u64 {
    STATE.with(|s| {
        let next = s.get().wrapping_add(1);
        s.set(next);
        mix(next)
    })
}

fn turn(index: usize) -> u64 {
    TURNS.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() <= index {
            // Once per route and worker (and after a reload that adds routes).
            t.resize(index + 1, 0);
        }
        let turn = t[index];
        t[index] = turn.wrapping_add(1);
        turn
    })
}

/// The addresses a connection for `want` leaves from by route `e`.
pub(crate) fn pick<'e>(e: &'e Egress, want: &Want<'_>) -> Picked<'e> {
    let draw = match want.seed {
        Some(seed) => Draw::Seed(seed),
        None if e.varies(None) => {
            Draw::Fresh { turn: turn(e.index), random: [random(), random(), random()] }
        }
        // One address per family: nothing to draw.
        None => Draw::Seed(0),
    };
    e.pick(want.local, draw)
}

/// `base` (a pool key) followed by the addresses and interface `picked` leaves from. An
/// empty key for a connection that must not be pooled (`Upstreams::put` closes it).
pub(crate) fn pool_key(base: &[u8], picked: &Picked<'_>, varies: bool) -> Box<[u8]> {
    use std::io::Write as _;
    if varies {
        return Box::default();
    }
    let mut key = Vec::with_capacity(base.len() + 48);
    key.extend_from_slice(base);
    key.extend_from_slice(b"\0from");
    for local in [picked.v4, picked.v6].into_iter().flatten() {
        let _ = write!(key, " {}", local.ip);
    }
    if let Some(name) = picked.interface {
        let _ = write!(key, " dev {name}");
    }
    key.into_boxed_slice()
}

/// The addresses of `ips` that `picked` has an outgoing address for; the error when it
/// has none for any of them.
pub(crate) fn usable(
    ips: Vec<IpAddr>,
    picked: &Picked<'_>,
    host: &str,
) -> Result<Vec<IpAddr>, ConnectError> {
    let first = ips.first().copied();
    let usable: Vec<IpAddr> = ips.into_iter().filter(|ip| picked.for_ip(*ip).is_ok()).collect();
    match (usable.is_empty(), first) {
        (true, Some(ip)) => {
            let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
            Err(ConnectError::NoEgress(format!(
                "route `{}` has no {family} outgoing address for {host}",
                picked.route
            )))
        }
        _ => Ok(usable),
    }
}

/// A connection to `addr` from the address `picked` has for its family.
pub(crate) async fn connect(
    addr: SocketAddr,
    picked: &Picked<'_>,
) -> Result<TcpStream, ConnectError> {
    let local = picked.for_ip(addr.ip()).ok().flatten();
    let from = local.map(|l| (l.ip, l.freebind));
    let socket =
        crate::io::egress::tcp(addr.is_ipv6(), from, picked.interface).map_err(|source| {
            let local = match (local, picked.interface) {
                (Some(l), Some(dev)) => format!("{} on {dev}", l.ip),
                (Some(l), None) => l.ip.to_string(),
                (None, Some(dev)) => format!("interface {dev}"),
                (None, None) => "an unbound socket".into(),
            };
            ConnectError::Bind { local, source }
        })?;
    socket.connect(addr).await.map_err(|e| ConnectError::from_io(addr, e))
}

/// Where a direct UDP association (or a UDP relay session) sends from: its route's
/// addresses, picked once for the association, and its interface.
pub(crate) struct UdpFrom {
    v4: Option<Local>,
    v6: Option<Local>,
    only: bool,
    interface: Option<Box<str>>,
    route: Box<str>,
}

impl UdpFrom {
    /// A socket for datagrams to `dst`'s family from the route's address for it; the
    /// error says when the route has none.
    pub(crate) fn socket(&self, dst: SocketAddr) -> Result<tokio::net::UdpSocket, String> {
        let local = match dst {
            SocketAddr::V4(_) => self.v4,
            SocketAddr::V6(_) => self.v6,
        };
        if local.is_none() && self.only {
            let family = if dst.is_ipv4() { "IPv4" } else { "IPv6" };
            return Err(format!(
                "route `{}` has no {family} outgoing address for {dst}",
                self.route
            ));
        }
        let from = local.map(|l| (l.ip, l.freebind));
        crate::io::egress::udp(dst.is_ipv6(), from, self.interface.as_deref()).map_err(|e| {
            match local {
                Some(l) => format!("cannot send from {}: {e}", l.ip),
                None => format!("cannot bind: {e}"),
            }
        })
    }
}

impl super::Upstreams {
    /// The outgoing addresses of a direct UDP association for `want`, when its route has
    /// `bind` or `interface` (the route chosen as for a TCP connection, on what the client
    /// declared). None: the wildcard address, as without routes.
    pub(crate) fn udp_from(
        &self,
        policy: &crate::policy::Policy,
        want: &Want<'_>,
    ) -> Option<UdpFrom> {
        if policy.routes.is_empty() {
            return None;
        }
        let access = want.access(policy);
        let crate::policy::route::Choice::Direct { egress: Some(e), .. } =
            policy.routes.choose(&access.request(None))
        else {
            return None;
        };
        let p = pick(e, want);
        Some(UdpFrom {
            v4: p.v4,
            v6: p.v6,
            only: p.only,
            interface: p.interface.map(Into::into),
            route: p.route.into(),
        })
    }
}
