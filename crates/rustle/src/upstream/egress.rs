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
        let crate::policy::route::Choice::Direct { route, egress: Some(e) } =
            policy.routes.choose(&access.request(None))
        else {
            return None;
        };
        let p = pick(e, &want.seeded(policy, route));
        Some(UdpFrom {
            v4: p.v4,
            v6: p.v6,
            only: p.only,
            interface: p.interface.map(Into::into),
            route: p.route.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(bind: &[&str]) -> Egress {
        let cfg = crate::config::EgressConfig {
            bind: bind.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        Egress::build(&cfg, 0, "r").expect("valid").expect("set")
    }

    const ANY: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

    fn want(seed: Option<u64>) -> Want<'static> {
        Want {
            addrs: (&ANY, &ANY),
            host: "example.com",
            port: 80,
            protocol: crate::acl::Protocol::Http,
            client: IpAddr::from([192, 0, 2, 1]),
            user: None,
            listener: None,
            tls: super::super::Tls::Plain,
            local: None,
            params: None,
            seed,
        }
    }

    #[test]
    fn pool_keys_name_the_addresses_and_rotation_is_never_pooled() {
        let fixed = egress(&["198.18.0.1", "2001:db8::1"]);
        let p = pick(&fixed, &want(None));
        assert_eq!(&*pool_key(b"a:80", &p, false), b"a:80\0from 198.18.0.1 2001:db8::1");
        let rotating = egress(&["2001:db8:1::/64"]);
        assert!(rotating.varies(None));
        assert!(pool_key(b"a:80", &pick(&rotating, &want(None)), true).is_empty());
        // Per worker and seeded picks.
        let a = pick(&rotating, &want(None)).v6;
        let b = pick(&rotating, &want(None)).v6;
        assert_ne!(a, b, "a fresh address per connection");
        let s1 = pick(&rotating, &want(Some(7)));
        assert_eq!(s1, pick(&rotating, &want(Some(7))));
        assert!(!rotating.varies(Some(7)));
        let key = pool_key(b"a:80", &s1, false);
        assert!(
            key.starts_with(b"a:80\0from 2001:db8:1:0:"),
            "{:?}",
            String::from_utf8_lossy(&key)
        );
    }

    #[test]
    fn a_family_without_an_address_is_refused_by_name() {
        let v6 = egress(&["2001:db8:1::/64"]);
        let p = pick(&v6, &want(None));
        let v4: IpAddr = "192.0.2.9".parse().expect("ip");
        let both = vec![v4, "2001:db8::9".parse().expect("ip")];
        assert_eq!(
            usable(both, &p, "h").expect("the v6 one"),
            ["2001:db8::9".parse::<IpAddr>().expect("ip")]
        );
        let err = usable(vec![v4], &p, "example.com").expect_err("no v4");
        assert_eq!(err.to_string(), "route `r` has no IPv4 outgoing address for example.com");
    }
}
