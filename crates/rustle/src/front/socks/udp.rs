//! SOCKS5 UDP ASSOCIATE. Datagrams are relayed one by one; nothing is buffered beyond the
//! datagram in hand.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use std::sync::{Mutex, PoisonError};

use rustle_proto::addr::{Address, Host};
use rustle_proto::socks5;
use tokio::io::AsyncReadExt;
use tokio::net::UdpSocket;

use super::{reply5, Session};
use crate::error::Error;
use crate::front::worker::Worker;
use crate::upstream::UdpVia;

/// Largest UDP payload; a datagram buffer of this size never truncates.
pub(crate) const MAX_DATAGRAM: usize = 65_535;

/// Destinations one association may have sent to; replies are accepted only from these.
const MAX_PEERS: usize = 4096;

/// The relay sockets of every UDP association in this process. A datagram sent to one of
/// them comes back to rustle from its own address on the client's host, where it passes
/// for the client's: refused as a destination, as TCP refuses the listening addresses.
/// Locked when an association starts or ends and when it names a new destination.
static RELAY_SOCKETS: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

/// An association's relay socket, in `RELAY_SOCKETS` while it lives.
struct Registered(SocketAddr);

impl Registered {
    fn new(addr: SocketAddr) -> Registered {
        RELAY_SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).push(addr);
        Registered(addr)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut list = RELAY_SOCKETS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = list.iter().position(|a| *a == self.0) {
            list.swap_remove(i);
        }
    }
}

/// Whether `dst` is one of rustle's UDP association sockets.
fn is_relay_socket(dst: SocketAddr) -> bool {
    let list = RELAY_SOCKETS.lock().unwrap_or_else(PoisonError::into_inner);
    list.iter().any(|own| crate::acl::reaches(dst, *own))
}

/// What an association or relay session moved, for its log line.
#[derive(Default)]
struct Counts {
    up: u64,
    down: u64,
    dropped: u64,
    /// The user's traffic counters: each datagram counts as it goes.
    user: Option<std::sync::Arc<crate::limits::UserTraffic>>,
}

impl Counts {
    fn new(s: &Session) -> Counts {
        Counts { user: s.traffic.clone(), ..Counts::default() }
    }

    fn add(&mut self, dir: crate::limits::Direction, n: usize) {
        let n = n as u64;
        match dir {
            crate::limits::Direction::Up => self.up += n,
            crate::limits::Direction::Down => self.down += n,
        }
        if let Some(t) = &self.user {
            t.add(dir, n);
        }
    }

    /// Why the association ends, when its user's quota ends open tunnels.
    fn cut(&self) -> Option<Error> {
        let t = self.user.as_deref().filter(|t| t.cut())?;
        t.over_quota()
    }

    /// The association's totals to the session, and which of them the user's counters
    /// have already.
    fn finish(&self, s: &mut Session) {
        (s.up, s.down) = (self.up, self.down);
        s.counted = self.user.is_some();
    }
}

/// UDP ASSOCIATE: a relay socket on the address the client reached us on; datagrams
/// from the client's host carry a SOCKS5 header naming their destination; replies come
/// back with a header naming their source. Ends with the TCP control connection or
/// after `timeouts.udp_idle` without a datagram.
pub(super) async fn associate(s: &mut Session, hint: &Address) -> Result<(), Error> {
    // A route may send the association through a SOCKS5 parent, or from its own
    // outgoing addresses.
    let (through, from) = {
        let worker = s.worker.clone();
        let policy = worker.policy();
        let host = match &hint.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Domain(d) => d.as_str().to_string(),
        };
        let want = s.want(&host, hint.port);
        let timeouts = &worker.cfg().timeouts;
        match Box::pin(worker.upstreams.udp_route(&policy, &want, timeouts)).await {
            Ok(Some(through)) => (Some(through), None),
            Ok(None) => (None, worker.upstreams.udp_from(&policy, &want)),
            Err(e) => {
                reply5(s, e.socks5_reply(), None).await;
                return Err(e);
            }
        }
    };
    if let Some(through) = through {
        return Box::pin(associate_via(s, hint, through)).await;
    }
    let (relay, _registered) = relay_socket(s).await?;
    reply5(s, socks5::Reply::Succeeded, Some(_registered.0)).await;
    let idle = s.worker.cfg().timeouts.udp_idle;
    let mut client = Client::new(s.peer.ip(), hint);
    let mut out4: Option<UdpSocket> = None;
    let mut out6: Option<UdpSocket> = None;
    let mut peers: HashSet<SocketAddr> = HashSet::new();
    // Names the rules' precheck let through.
    let mut names: HashSet<Address> = HashSet::new();
    let mut from_client = vec![0u8; MAX_DATAGRAM];
    let mut from_peer4 = vec![0u8; MAX_DATAGRAM];
    let mut from_peer6 = vec![0u8; MAX_DATAGRAM];
    let mut back = Vec::with_capacity(MAX_DATAGRAM + socks5::MAX_UDP_HEADER);
    let mut counts = Counts::new(s);
    let mut control = [0u8; 64];
    let result = loop {
        // A quota with `on_exceeded = "close"` ends the association at its next datagram.
        if let Some(e) = counts.cut() {
            break Err(e);
        }
        let timer = tokio::time::sleep(idle);
        tokio::select! {
            // The association lives as long as its TCP connection.
            r = s.stream.read(&mut control) => match r {
                Ok(0) | Err(_) => break Ok(()),
                Ok(_) => continue,
            },
            _ = timer => break Ok(()),
            r = relay.recv_from(&mut from_client) => {
                let (n, src) = r.map_err(Error::Upstream)?;
                let Some((header, offset)) = client.datagram(src, &from_client[..n]) else {
                    counts.dropped += 1;
                    continue;
                };
                // A name: the rules that need no address first, so that a name they
                // refuse is never looked up (once per name: `names`).
                if let Host::Domain(d) = &header.dst.host {
                    if !names.contains(&header.dst) {
                        let policy = s.worker.policy();
                        if let Err(why) = s.want(d.as_str(), header.dst.port).precheck(&policy) {
                            tracing::debug!("{}: UDP to {}:{} {why}", s.peer, d.as_str(), header.dst.port);
                            counts.dropped += 1;
                            continue;
                        }
                        if names.len() < MAX_PEERS {
                            names.insert(header.dst.clone());
                        }
                    }
                }
                let Some(dst) = resolve_udp(&s.worker, &header.dst).await else {
                    counts.dropped += 1;
                    continue;
                };
                if !peers.contains(&dst) {
                    if is_relay_socket(dst) {
                        tracing::debug!("{}: UDP to {dst} refused: a relay socket of the proxy", s.peer);
                        counts.dropped += 1;
                        continue;
                    }
                    // A new destination: the access rules decide, as for a CONNECT.
                    let policy = s.worker.policy();
                    let host = match &header.dst.host {
                        Host::Ip(ip) => ip.to_string(),
                        Host::Domain(d) => d.as_str().to_string(),
                    };
                    let want = s.want(&host, dst.port());
                    if let Some(d) = want.check(&policy, dst) {
                        tracing::debug!("{}: UDP to {dst} {d}", s.peer);
                        counts.dropped += 1;
                        continue;
                    }
                }
                let out = match out_socket(dst, &mut out4, &mut out6, from.as_ref()).await {
                    Ok(o) => o,
                    Err(why) => {
                        tracing::debug!("{}: UDP to {dst}: {why}", s.peer);
                        counts.dropped += 1;
                        continue;
                    }
                };
                if out.send_to(&from_client[offset..n], dst).await.is_ok() {
                    counts.add(crate::limits::Direction::Up, n - offset);
                    if peers.len() < MAX_PEERS {
                        peers.insert(dst);
                    }
                } else {
                    counts.dropped += 1;
                }
            }
            r = recv_opt(&out4, &mut from_peer4) => {
                relay_back(r, &peers, client.udp, &relay, &from_peer4, &mut back, &mut counts).await;
            }
            r = recv_opt(&out6, &mut from_peer6) => {
                relay_back(r, &peers, client.udp, &relay, &from_peer6, &mut back, &mut counts).await;
            }
        }
    };
    counts.finish(s);
    if counts.dropped > 0 {
        tracing::debug!("{}: UDP association dropped {} datagram(s)", s.peer, counts.dropped);
    }
    result
}

/// The association's relay socket, on the address the client reached us on, listed among
/// the process's relay sockets while it lives; a failure is answered (general failure).
async fn relay_socket(s: &mut Session) -> Result<(UdpSocket, Registered), Error> {
    let bound = async {
        let local_ip = s.stream.local_addr()?.ip();
        let relay = UdpSocket::bind((local_ip, 0)).await?;
        let addr = relay.local_addr()?;
        Ok::<_, io::Error>((relay, addr))
    };
    match bound.await {
        Ok((relay, addr)) => Ok((relay, Registered::new(addr))),
        Err(e) => {
            reply5(s, socks5::Reply::GeneralFailure, None).await;
            Err(Error::Upstream(e))
        }
    }
}

/// A datagram from a destination goes back to the client with a SOCKS5 header, but only
/// from destinations the client has sent to.
async fn relay_back(
    r: io::Result<(usize, SocketAddr)>,
    peers: &HashSet<SocketAddr>,
    client: Option<SocketAddr>,
    relay: &UdpSocket,
    data: &[u8],
    back: &mut Vec<u8>,
    counts: &mut Counts,
) {
    let Ok((n, src)) = r else { return };
    let (Some(client), true) = (client, peers.contains(&src)) else {
        counts.dropped += 1;
        return;
    };
    back.clear();
    socks5::write_udp_header(src, back);
    back.extend_from_slice(&data[..n]);
    if relay.send_to(back, client).await.is_ok() {
        counts.add(crate::limits::Direction::Down, n);
    } else {
        counts.dropped += 1;
    }
}

async fn recv_opt(sock: &Option<UdpSocket>, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    match sock {
        Some(s) => s.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

/// The outgoing socket for a destination's family, made on first use: from the route's
/// address for that family when it has `bind` (`from`), else the wildcard.
async fn out_socket<'a>(
    dst: SocketAddr,
    out4: &'a mut Option<UdpSocket>,
    out6: &'a mut Option<UdpSocket>,
    from: Option<&crate::upstream::UdpFrom>,
) -> Result<&'a UdpSocket, String> {
    let (slot, any) = match dst {
        SocketAddr::V4(_) => (out4, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        SocketAddr::V6(_) => (out6, IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    };
    if slot.is_none() {
        *slot = Some(match from {
            Some(from) => from.socket(dst)?,
            None => UdpSocket::bind((any, 0)).await.map_err(|e| format!("cannot bind: {e}"))?,
        });
    }
    slot.as_ref().ok_or_else(|| "no socket".to_string())
}

async fn resolve_udp(worker: &Worker, dst: &Address) -> Option<SocketAddr> {
    match &dst.host {
        Host::Ip(ip) => Some(SocketAddr::new(*ip, dst.port)),
        Host::Domain(d) => {
            let ips = worker.upstreams.resolve(d.as_str()).await.ok()?;
            ips.first().map(|ip| SocketAddr::new(*ip, dst.port))
        }
    }
}

/// UDP ASSOCIATE chained through a SOCKS5 parent's own association (`UdpVia`): the
/// client's datagrams go to the parent's relay as they came, SOCKS5 header and all, once
/// the access rules allow their destination; the parent's come back to the client as
/// they came. Ends with either TCP connection (the client's or the parent's), or after
/// `timeouts.udp_idle` without a datagram.
async fn associate_via(s: &mut Session, hint: &Address, mut via: UdpVia) -> Result<(), Error> {
    let bind_out: SocketAddr = match via.relay {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let (relay, _registered) = relay_socket(s).await?;
    let out = async {
        let out = UdpSocket::bind(bind_out).await?;
        out.connect(via.relay).await?;
        Ok::<_, io::Error>(out)
    };
    let out = match out.await {
        Ok(out) => out,
        Err(e) => {
            reply5(s, socks5::Reply::GeneralFailure, None).await;
            return Err(Error::Upstream(e));
        }
    };
    s.upstream = Some(via.relay);
    s.via = Some(via.via.clone());
    reply5(s, socks5::Reply::Succeeded, Some(_registered.0)).await;
    let idle = s.worker.cfg().timeouts.udp_idle;
    let mut client = Client::new(s.peer.ip(), hint);
    let mut allowed: HashSet<Address> = HashSet::new();
    let mut from_client = vec![0u8; MAX_DATAGRAM];
    let mut from_parent = vec![0u8; MAX_DATAGRAM];
    let mut counts = Counts::new(s);
    let mut control = [0u8; 64];
    let mut parent_control = [0u8; 64];
    let result = loop {
        // A quota with `on_exceeded = "close"` ends the association at its next datagram.
        if let Some(e) = counts.cut() {
            break Err(e);
        }
        let timer = tokio::time::sleep(idle);
        tokio::select! {
            r = s.stream.read(&mut control) => match r {
                Ok(0) | Err(_) => break Ok(()),
                Ok(_) => continue,
            },
            r = via.control.read(&mut parent_control) => match r {
                Ok(0) => break Err(Error::UpstreamClosed("the UDP association's control connection")),
                Err(e) => break Err(Error::Upstream(e)),
                Ok(_) => continue,
            },
            _ = timer => break Ok(()),
            r = relay.recv_from(&mut from_client) => {
                let (n, src) = r.map_err(Error::Upstream)?;
                let Some((header, offset)) = client.datagram(src, &from_client[..n]) else {
                    counts.dropped += 1;
                    continue;
                };
                if !allowed.contains(&header.dst) {
                    // A new destination: the access rules decide, on the name the parent
                    // will resolve (resolved here only when a rule needs its address).
                    if !destination_allowed(s, &header.dst).await {
                        counts.dropped += 1;
                        continue;
                    }
                    if allowed.len() < MAX_PEERS {
                        allowed.insert(header.dst.clone());
                    }
                }
                if out.send(&from_client[..n]).await.is_ok() {
                    counts.add(crate::limits::Direction::Up, n - offset);
                } else {
                    counts.dropped += 1;
                }
            }
            r = out.recv(&mut from_parent) => {
                let Ok(n) = r else { counts.dropped += 1; continue };
                let (Some(client), Ok((_, offset))) =
                    (client.udp, socks5::parse_udp(&from_parent[..n]))
                else {
                    counts.dropped += 1;
                    continue;
                };
                if relay.send_to(&from_parent[..n], client).await.is_ok() {
                    counts.add(crate::limits::Direction::Down, n - offset);
                } else {
                    counts.dropped += 1;
                }
            }
        }
    };
    counts.finish(s);
    if counts.dropped > 0 {
        tracing::debug!("{}: UDP association dropped {} datagram(s)", s.peer, counts.dropped);
    }
    result
}

/// Whether the access rules let this association send to `dst`, a destination reached
/// through a parent: the rules on its name, and on its address when they need one (a
/// literal, or the name resolved here).
async fn destination_allowed(s: &Session, dst: &Address) -> bool {
    let policy = s.worker.policy();
    let host = match &dst.host {
        Host::Ip(ip) => ip.to_string(),
        Host::Domain(d) => d.as_str().to_string(),
    };
    let want = s.want(&host, dst.port);
    let needs_address = match want.precheck(&policy) {
        Ok(needs) => needs,
        Err(d) => {
            tracing::debug!("{}: UDP to {host}:{} {d}", s.peer, dst.port);
            return false;
        }
    };
    if !needs_address {
        return true;
    }
    let Some(addr) = resolve_udp(&s.worker, dst).await else { return false };
    match want.check(&policy, addr) {
        None => true,
        Some(d) => {
            tracing::debug!("{}: UDP to {addr} {d}", s.peer);
            false
        }
    }
}

/// The client's side of an association: datagrams are taken only from the TCP client's
/// host (and from the port it declared, when it declared one); the first one fixes where
/// replies go.
struct Client {
    ip: IpAddr,
    port: Option<u16>,
    /// Where the client's datagrams come from, once one has.
    udp: Option<SocketAddr>,
}

impl Client {
    /// RFC 1928: the client may name the address it will send from; zeros mean unknown. A
    /// socket bound to INADDR_ANY knows its port but not its address, so a port alone
    /// counts as declared.
    fn new(ip: IpAddr, hint: &Address) -> Client {
        Client { ip, port: (hint.port != 0).then_some(hint.port), udp: None }
    }

    /// A datagram from `src`: its SOCKS5 header and where its payload starts, or None to
    /// drop it (from elsewhere, malformed, or a fragment: fragmentation is optional in RFC
    /// 1928, and rustle does not reassemble).
    fn datagram(&mut self, src: SocketAddr, bytes: &[u8]) -> Option<(socks5::UdpHeader, usize)> {
        if src.ip() != self.ip || self.port.is_some_and(|p| p != src.port()) {
            return None;
        }
        self.udp.get_or_insert(src);
        let (header, offset) = socks5::parse_udp(bytes).ok()?;
        (header.frag == 0).then_some((header, offset))
    }
}
