//! Listening sockets: bound here (one per worker, SO_REUSEPORT, so that the kernel spreads
//! connections over the workers), or inherited from a rustle being taken over or from
//! the service manager (socket activation) and shared out to the workers. The main thread
//! keeps one copy of every socket, for reloads and for handing them over.

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use anyhow::Context as _;
use socket2::{Domain, Protocol, Socket as Socket2, Type};

use crate::config::{ListenerKey, ListenerKind};
use crate::policy::Listener;

/// Pending connections per listening socket; the kernel caps it at somaxconn.
const BACKLOG: i32 = 4096;

/// How long an HTTP, HTTPS, SOCKS or auto listener lets the kernel hold a connection that
/// has sent nothing yet (TCP_DEFER_ACCEPT) before handing it over.
const DEFER_ACCEPT_SECS: u32 = 1;

/// A listening socket.
pub(crate) enum Socket {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

impl Socket {
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Socket::Tcp(s) => s.local_addr(),
            Socket::Udp(s) => s.local_addr(),
        }
    }

    /// Another descriptor for the same socket.
    pub(crate) fn try_clone(&self) -> std::io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Udp(s) => Socket::Udp(s.try_clone()?),
        })
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Tcp(s) => s.as_fd(),
            Socket::Udp(s) => s.as_fd(),
        }
    }

    pub(crate) fn is_udp(&self) -> bool {
        matches!(self, Socket::Udp(_))
    }

    /// A socket received from another process: a listening TCP socket or a bound UDP
    /// one, anything else refused.
    pub(crate) fn from_fd(fd: OwnedFd) -> std::io::Result<Socket> {
        let s = Socket2::from(fd);
        let bad = |what: &str| std::io::Error::other(format!("not a listening socket: {what}"));
        let addr = s.local_addr()?.as_socket().ok_or_else(|| bad("not an IP socket"))?;
        let socket = match s.r#type()? {
            Type::STREAM if s.is_listener()? => Socket::Tcp(s.into()),
            Type::STREAM => return Err(bad(&format!("a TCP socket on {addr} not listening"))),
            Type::DGRAM => Socket::Udp(s.into()),
            _ => return Err(bad("neither TCP nor UDP")),
        };
        socket.set_nonblocking()?;
        Ok(socket)
    }

    fn set_nonblocking(&self) -> std::io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_nonblocking(true),
            Socket::Udp(s) => s.set_nonblocking(true),
        }
    }
}

/// One listener's sockets as the main thread keeps them: each distinct socket once (one
/// per worker when bound here; as many as were handed over when inherited).
pub(crate) struct Bound {
    /// The listener's settings, its `listen` the address bound (port 0 resolved).
    pub(crate) listener: Arc<Listener>,
    pub(crate) sockets: Vec<Socket>,
}

impl Bound {
    /// Worker `worker`'s own descriptors of the listener's sockets: with as many sockets
    /// as workers, one each; with more, some workers take several; with fewer (a socket
    /// from the service manager), workers share them.
    pub(crate) fn for_worker(&self, worker: usize, workers: usize) -> std::io::Result<Vec<Socket>> {
        let n = self.sockets.len();
        let picks: Vec<usize> = match n >= workers {
            true => (worker..n).step_by(workers.max(1)).collect(),
            false if n == 0 => Vec::new(),
            false => vec![worker % n],
        };
        picks.into_iter().map(|i| self.sockets[i].try_clone()).collect()
    }

    /// Sets what the listener's kind wants on its TCP sockets (a reload may change the
    /// kind of a listener whose socket stays).
    pub(crate) fn set_kind(&self, kind: ListenerKind) -> std::io::Result<()> {
        for s in &self.sockets {
            if let Socket::Tcp(s) = s {
                tcp_options(&socket2::SockRef::from(s), kind)?;
            }
        }
        Ok(())
    }
}

/// A group of sockets handed over for one listener.
pub(crate) struct Group {
    /// The listener's key in the process that handed it over (none from the service
    /// manager).
    pub(crate) key: Option<ListenerKey>,
    pub(crate) addr: SocketAddr,
    pub(crate) udp: bool,
    pub(crate) sockets: Vec<Socket>,
}

/// Sockets handed over by a rustle being taken over, or by the service manager, not yet
/// given to a listener.
#[derive(Default)]
pub(crate) struct Inherited {
    pub(crate) groups: Vec<Group>,
    /// The admin endpoint's socket handed over by a rustle being taken over, with the
    /// address configured there.
    pub(crate) admin: Option<(SocketAddr, std::net::TcpListener)>,
}

impl Inherited {
    /// Sockets from the service manager, grouped by address.
    pub(crate) fn from_sockets(sockets: Vec<Socket>) -> std::io::Result<Inherited> {
        let mut inherited = Inherited::default();
        for s in sockets {
            let (addr, udp) = (s.local_addr()?, s.is_udp());
            match inherited.groups.iter_mut().find(|g| g.addr == addr && g.udp == udp) {
                Some(g) => g.sockets.push(s),
                None => inherited.groups.push(Group { key: None, addr, udp, sockets: vec![s] }),
            }
        }
        Ok(inherited)
    }

    /// The socket for an admin endpoint configured on `listen`: the one handed over for the
    /// same configured address (a takeover), else a TCP socket bound to it (a fixed port:
    /// socket activation). One handed over for another address is closed.
    pub(crate) fn take_admin(
        &mut self,
        listen: Option<SocketAddr>,
    ) -> Option<std::net::TcpListener> {
        let handed = self.admin.take();
        let listen = listen?;
        match handed {
            Some((configured, socket)) if configured == listen => return Some(socket),
            Some((configured, _)) => tracing::info!(
                "the admin socket handed over ({configured}) is not this configuration's \
                 ({listen}); closed"
            ),
            None => {}
        }
        let i = (listen.port() != 0)
            .then(|| self.groups.iter().position(|g| g.key.is_none() && !g.udp && g.addr == listen))
            .flatten()?;
        let mut group = self.groups.swap_remove(i);
        match group.sockets.pop() {
            Some(Socket::Tcp(s)) => Some(s),
            _ => None,
        }
    }

    /// The sockets for `l`: those of the same key (a takeover), else those bound to the
    /// address it asks for (a fixed port, same transport).
    fn take(&mut self, l: &Listener) -> Option<Group> {
        let udp = l.kind == ListenerKind::UdpRelay;
        let i = self.groups.iter().position(|g| g.key == Some(l.key)).or_else(|| {
            (l.listen.port() != 0)
                .then(|| self.groups.iter().position(|g| g.addr == l.listen && g.udp == udp))
                .flatten()
        })?;
        let g = self.groups.swap_remove(i);
        (g.udp == udp).then_some(g)
    }
}

/// Binds `l` once per worker (the first socket first, so that port 0 resolves to one port
/// shared by all), or takes its sockets from `inherited`. An address something else
/// already serves is refused (`ensure_unused`).
pub(super) fn bind(
    l: &Listener,
    workers: usize,
    inherited: &mut Inherited,
) -> anyhow::Result<Bound> {
    let udp = l.kind == ListenerKind::UdpRelay;
    if let Some(g) = inherited.take(l) {
        let mut l = l.clone();
        l.listen = g.addr;
        let bound = Bound { listener: Arc::new(l), sockets: g.sockets };
        bound.set_kind(bound.listener.kind).with_context(|| format!("listener {}", g.addr))?;
        return Ok(bound);
    }
    if l.listen.port() != 0 {
        ensure_unused(l.listen, udp)?;
    }
    let mut addr = l.listen;
    let mut sockets = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let s = match udp {
            true => bind_udp(addr).map(Socket::Udp),
            false => bind_tcp(addr, l.kind).map(Socket::Tcp),
        }
        .with_context(|| format!("cannot listen on {addr}"))?;
        addr = s.local_addr()?;
        sockets.push(s);
    }
    let mut l = l.clone();
    l.listen = addr;
    Ok(Bound { listener: Arc::new(l), sockets })
}

/// Fails, naming the address, when a socket already listens on `addr` (TCP) or is bound
/// to it (UDP). The workers' sockets use SO_REUSEPORT, which would let them join those of
/// another rustle started on the same address (same user), the two then splitting the
/// traffic: so first a probe socket is bound there without SO_REUSEPORT, which the kernel
/// refuses (EADDRINUSE) while any socket serves the address, a SO_REUSEPORT group or a
/// wildcard listener covering it included. For TCP the probe has SO_REUSEADDR, so that
/// connections of an earlier run left in TIME_WAIT do not count. The probe is closed
/// before the real sockets are bound.
pub(crate) fn ensure_unused(addr: SocketAddr, udp: bool) -> anyhow::Result<()> {
    let probe = || -> std::io::Result<()> {
        let (ty, proto) = match udp {
            true => (Type::DGRAM, Protocol::UDP),
            false => (Type::STREAM, Protocol::TCP),
        };
        let s = Socket2::new(Domain::for_address(addr), ty, Some(proto))?;
        if !udp {
            s.set_reuse_address(true)?;
        }
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&addr.into())
    };
    match probe() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(anyhow::anyhow!(
            "cannot listen on {addr} ({}): the address is already in use, by another \
             process or another listener of this configuration (to replace a running \
             rustle without refusing a connection, start the new one with --takeover)",
            if udp { "udp" } else { "tcp" }
        )),
        Err(e) => Err(e).with_context(|| format!("cannot listen on {addr}")),
    }
}

fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let s = Socket2::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // The kernel hashes each client address to one of the workers' sockets, so a
    // client's session stays on one worker.
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

fn bind_tcp(addr: SocketAddr, kind: ListenerKind) -> std::io::Result<std::net::TcpListener> {
    let s = Socket2::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    tcp_options(&s, kind)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    Ok(s.into())
}

/// What a listening TCP socket of this kind is set up with.
fn tcp_options(s: &Socket2, kind: ListenerKind) -> std::io::Result<()> {
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux: one setsockopt
    // here instead of one per connection.
    s.set_tcp_nodelay(true)?;
    // A plain HTTP (or auto-detected) connection starts unregistered and reads at once
    // (`Stream::Fresh`): accepted only with its first bytes there, it is served without
    // waiting on epoll. SOCKS and TLS clients speak first too: their connections come with
    // their greeting or ClientHello, one wake-up instead of two. (A port relay does not
    // know who speaks first: no deferral there; 0 turns it off.)
    let defer = matches!(
        kind,
        ListenerKind::Http | ListenerKind::Auto | ListenerKind::Socks | ListenerKind::Https
    );
    crate::io::sys::defer_accept(s, if defer { DEFER_ACCEPT_SECS } else { 0 })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A listener of `kind` on `addr` as the server runs it.
    fn running(kind: ListenerKind, addr: SocketAddr) -> Listener {
        Listener::new(crate::config::Listener::new(kind, addr), 1).unwrap()
    }

    fn bound(n: usize) -> Bound {
        let l = running(ListenerKind::Http, "127.0.0.1:0".parse().unwrap());
        let mut inherited = Inherited::default();
        bind(&l, n, &mut inherited).expect("bind")
    }

    fn fds(sockets: &[Socket]) -> Vec<u64> {
        use std::os::fd::AsRawFd;
        // The socket's inode tells sockets apart (descriptors of one socket share it).
        sockets
            .iter()
            .map(|s| {
                let path = format!("/proc/self/fd/{}", s.fd().as_raw_fd());
                let link = std::fs::read_link(path).unwrap();
                let text = link.to_string_lossy().into_owned();
                text.trim_start_matches("socket:[").trim_end_matches(']').parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn sockets_are_shared_out_to_workers() {
        // As many as workers: one each.
        let b = bound(3);
        let all = fds(&b.sockets);
        for (w, socket) in all.iter().enumerate() {
            assert_eq!(fds(&b.for_worker(w, 3).unwrap()), [*socket]);
        }
        // More sockets than workers: every socket served, some workers take two.
        let mut served: Vec<u64> = (0..2).flat_map(|w| fds(&b.for_worker(w, 2).unwrap())).collect();
        served.sort();
        let mut expected = all.clone();
        expected.sort();
        assert_eq!(served, expected);
        // Fewer: workers share.
        let one = bound(1);
        let only = fds(&one.sockets)[0];
        for w in 0..4 {
            assert_eq!(fds(&one.for_worker(w, 4).unwrap()), [only]);
        }
    }

    #[test]
    fn inherited_sockets_go_to_the_listener_of_their_key_or_address() {
        let b = bound(2);
        let addr = b.listener.listen;
        let mut l = running(ListenerKind::Socks, addr);
        l.key = ListenerKey { listen: addr, udp: false, rank: 0 };
        // By address (the service manager names none).
        let sockets: Vec<Socket> = b.sockets.iter().map(|s| s.try_clone().unwrap()).collect();
        let mut inherited = Inherited::from_sockets(sockets).unwrap();
        assert_eq!(inherited.groups.len(), 1);
        let got = bind(&l, 4, &mut inherited).unwrap();
        assert_eq!(got.sockets.len(), 2);
        assert_eq!(got.listener.listen, addr);
        assert!(inherited.groups.is_empty());
        // By key: a port-0 listener of the old process.
        let mut l0 = running(ListenerKind::Http, "127.0.0.1:0".parse().unwrap());
        l0.key = ListenerKey { listen: l0.listen, udp: false, rank: 0 };
        let sockets = b.sockets.iter().map(|s| s.try_clone().unwrap()).collect();
        let mut inherited = Inherited {
            groups: vec![Group { key: Some(l0.key), addr, udp: false, sockets }],
            admin: None,
        };
        assert_eq!(bind(&l0, 1, &mut inherited).unwrap().listener.listen, addr);
    }
}
