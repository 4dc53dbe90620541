//! Sockets that leave from a chosen local address or interface: TCP for the upstream
//! layer, UDP for associations and the UDP relay, and the host checks run at start and
//! on reload (can this address be bound, is non-local binding allowed, does the interface
//! exist). No `unsafe`: socket2 does the system calls.

use std::io;
use std::net::{IpAddr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// A socket of `domain` bound to `local` (port 0) with `IP_FREEBIND` when `freebind`,
/// and to `device` (SO_BINDTODEVICE) when one is given. Non-blocking.
fn socket(
    kind: Type,
    v6: bool,
    local: Option<(IpAddr, bool)>,
    device: Option<&str>,
) -> io::Result<Socket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let protocol = if kind == Type::STREAM { Protocol::TCP } else { Protocol::UDP };
    let s = Socket::new(domain, kind.nonblocking().cloexec(), Some(protocol))?;
    if let Some(name) = device {
        s.bind_device(Some(name.as_bytes()))?;
    }
    if let Some((ip, freebind)) = local {
        if freebind {
            match v6 {
                true => s.set_freebind_v6(true)?,
                false => s.set_freebind_v4(true)?,
            }
        }
        // The port is picked at connect time, against the connection's four-tuple: a
        // local port serves several destinations, and the kernel does not search its
        // table of bound ports for one (which costs more than this system call, even for
        // an address drawn from a prefix and seldom used twice).
        if kind == Type::STREAM {
            let _ = nix::sys::socket::setsockopt(
                &s,
                nix::sys::socket::sockopt::IpBindAddressNoPort,
                &true,
            );
        }
        s.bind(&SocketAddr::new(ip, 0).into())?;
    }
    Ok(s)
}

/// A TCP socket for a connection to an address of `v6`'s family, from `local` (with
/// `IP_FREEBIND` when its flag says so) and over `device`.
pub(crate) fn tcp(
    v6: bool,
    local: Option<(IpAddr, bool)>,
    device: Option<&str>,
) -> io::Result<tokio::net::TcpSocket> {
    let s = socket(Type::STREAM, v6, local, device)?;
    Ok(tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(s)))
}

/// A UDP socket for datagrams of `v6`'s family, bound to `local` (or the wildcard) and
/// `device`.
pub(crate) fn udp(
    v6: bool,
    local: Option<(IpAddr, bool)>,
    device: Option<&str>,
) -> io::Result<tokio::net::UdpSocket> {
    let any = match v6 {
        true => IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
        false => IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED),
    };
    let s = socket(Type::DGRAM, v6, Some(local.unwrap_or((any, false))), device)?;
    tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(s))
}

/// Binds a plain socket (no `IP_FREEBIND`) to `ip`: what the host says of sending from it.
pub(crate) fn try_bind(ip: IpAddr) -> io::Result<()> {
    let domain = if ip.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let s = Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    s.bind(&SocketAddr::new(ip, 0).into())
}

/// How long `try_receive` waits for its own datagram: it is delivered on this host, at
/// once, or never.
const LOOPBACK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether this host takes packets sent to `ip` as its own (a local route covers it, as
/// `ip route add local PREFIX dev lo` makes): a UDP socket bound there with `IP_FREEBIND`
/// receives a datagram sent to it. Err(AddrNotAvailable) when it does not arrive.
pub(crate) fn try_receive(ip: IpAddr) -> io::Result<()> {
    let domain = if ip.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let to = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    match ip.is_ipv6() {
        true => to.set_freebind_v6(true)?,
        false => to.set_freebind_v4(true)?,
    }
    to.bind(&SocketAddr::new(ip, 0).into())?;
    let at = to.local_addr()?.as_socket().ok_or_else(|| io::Error::other("not an IP socket"))?;
    to.set_read_timeout(Some(LOOPBACK_WAIT))?;
    let from = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    let not_here = || io::Error::from(io::ErrorKind::AddrNotAvailable);
    from.send_to(b"rustle", &at.into()).map_err(|_| not_here())?;
    let mut buf = [std::mem::MaybeUninit::new(0u8); 8];
    match to.recv(&mut buf) {
        Ok(6) => Ok(()),
        _ => Err(not_here()),
    }
}

/// Whether `net.ipv{4,6}.ip_nonlocal_bind` lets any address be bound.
pub(crate) fn nonlocal_bind(v6: bool) -> bool {
    let path = match v6 {
        true => "/proc/sys/net/ipv6/ip_nonlocal_bind",
        false => "/proc/sys/net/ipv4/ip_nonlocal_bind",
    };
    std::fs::read_to_string(path).is_ok_and(|s| s.trim() == "1")
}

/// Whether this host (its network namespace) has an interface of that name.
pub(crate) fn interface_exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}
