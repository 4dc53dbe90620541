//! The UDP port relay (3proxy's udppm): datagrams from each client address go to the
//! listener's fixed target from a connected socket of their own, and the target's replies
//! back. Datagrams are relayed one by one; nothing is buffered beyond the datagram in hand.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::UdpSocket;

use crate::front::worker::Worker;
use crate::policy::Listener;
use crate::telemetry::accesslog::{Parts, Protocol, Record};

/// Largest UDP payload; a datagram buffer of this size never truncates.
const MAX_DATAGRAM: usize = 65_535;

/// Client addresses one worker's UDP relay listener tracks at once.
const MAX_SESSIONS: usize = 16_384;

struct RelaySession {
    out: Rc<UdpSocket>,
    last: Cell<Instant>,
    /// Bytes from the client to the target.
    up: Cell<u64>,
}

/// The UDP port relay: each client address gets its own connected socket towards the
/// target, so replies need no lookup; a session ends after `timeouts.udp_idle` of silence.
/// The socket is shared with the worker's listener registry, so that a reload changing
/// the target goes on with the same socket.
pub(crate) async fn serve_relay(
    worker: Rc<Worker>,
    listener: Arc<Listener>,
    socket: Rc<UdpSocket>,
) {
    let Some(target) = listener.target.clone() else { return };
    let sessions: Rc<RefCell<HashMap<SocketAddr, Rc<RelaySession>>>> = Rc::default();
    let mut shutdown = worker.shutdown.clone();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, client) = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!("udp relay {}: {e}", listener.listen);
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let existing = sessions.borrow().get(&client).cloned();
        let session = match existing {
            Some(s) => s,
            None => {
                if sessions.borrow().len() >= MAX_SESSIONS {
                    continue;
                }
                let start = Instant::now();
                // The receive loop waits for the lookup: no longer than a connection
                // would wait for its target.
                let limit = worker.cfg().timeouts.connect;
                let made = session_socket(&worker, &listener, &socket, client, &target);
                let made = tokio::time::timeout(limit, made).await.unwrap_or_else(|_| {
                    Err(format!("{}: no address within the connect timeout", target.host))
                });
                let out = match made {
                    Ok(out) => out,
                    Err(why) => {
                        let name = format!("udp://{target}");
                        let parts = Parts { method: b"UDP", target: name.as_bytes() };
                        let mut r = Record::new(
                            client,
                            &listener,
                            &listener.counters,
                            Protocol::Udp,
                            start,
                        );
                        r.label = &parts;
                        r.error = Some(&why);
                        crate::front::exchange::end(&worker, None, r, None);
                        continue;
                    }
                };
                let dst = out.1;
                let out = out.0;
                let s = Rc::new(RelaySession {
                    out: Rc::new(out),
                    last: Cell::new(Instant::now()),
                    up: Cell::new(0),
                });
                sessions.borrow_mut().insert(client, s.clone());
                tokio::task::spawn_local(relay_session(
                    worker.clone(),
                    listener.clone(),
                    socket.clone(),
                    sessions.clone(),
                    client,
                    s.clone(),
                    format!("udp://{target}"),
                    dst,
                ));
                s
            }
        };
        session.last.set(Instant::now());
        if session.out.send(&buf[..n]).await.is_ok() {
            session.up.set(session.up.get() + n as u64);
        }
    }
}

/// A new session's socket, connected to the target; from the outgoing address of the
/// route the target takes (`bind`, `interface`), when it has one.
async fn session_socket(
    worker: &Worker,
    listener: &Listener,
    socket: &UdpSocket,
    client: SocketAddr,
    target: &crate::config::HostPort,
) -> Result<(UdpSocket, SocketAddr), String> {
    let ips = worker.upstreams.resolve(&target.host).await.map_err(|e| e.to_string())?;
    let ip = ips.first().ok_or_else(|| format!("{}: no address", target.host))?;
    let dst = SocketAddr::new(*ip, target.port);
    let any = match dst.is_ipv4() {
        true => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        false => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let from = {
        let policy = worker.policy();
        // The listener's own address stands for `same` (a wildcard one has none).
        let local = crate::upstream::local_of_udp(&policy, socket);
        let want = crate::upstream::Want {
            host: &target.host,
            port: target.port,
            protocol: Protocol::Udp,
            client: client.ip(),
            user: None,
            listener: listener.name.as_deref(),
            tls: crate::upstream::Tls::Plain,
            local,
            params: None,
            addrs: (&client, &listener.listen),
            seed: None,
        };
        worker.upstreams.udp_from(&policy, &want)
    };
    let out = match from {
        Some(from) => from.socket(dst)?,
        None => UdpSocket::bind((any, 0)).await.map_err(|e| format!("cannot bind: {e}"))?,
    };
    out.connect(dst).await.map_err(|e| format!("cannot connect to {dst}: {e}"))?;
    Ok((out, dst))
}

/// Replies from the target go back to one client until the session goes idle.
#[allow(clippy::too_many_arguments)]
async fn relay_session(
    worker: Rc<Worker>,
    listener: Arc<Listener>,
    socket: Rc<UdpSocket>,
    sessions: Rc<RefCell<HashMap<SocketAddr, Rc<RelaySession>>>>,
    client: SocketAddr,
    session: Rc<RelaySession>,
    name: String,
    dst: SocketAddr,
) {
    let start = Instant::now();
    let idle = worker.cfg().timeouts.udp_idle;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut down = 0u64;
    loop {
        match tokio::time::timeout(idle, session.out.recv(&mut buf)).await {
            Ok(Ok(n)) => {
                session.last.set(Instant::now());
                if socket.send_to(&buf[..n], client).await.is_ok() {
                    down += n as u64;
                }
            }
            Ok(Err(_)) => {}
            Err(_) if session.last.get().elapsed() < idle => {}
            Err(_) => break,
        }
        if worker.stopping.get() {
            break;
        }
    }
    sessions.borrow_mut().remove(&client);
    let up = session.up.get();
    let parts = Parts { method: b"UDP", target: name.as_bytes() };
    let mut record = Record::new(client, &listener, &listener.counters, Protocol::Udp, start);
    record.label = &parts;
    (record.up, record.down, record.upstream, record.tunnel) = (up, down, Some(dst), true);
    crate::front::exchange::end(&worker, None, record, None);
}
