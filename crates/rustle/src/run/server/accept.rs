//! The accept loop of a TCP listener on one worker.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::config::ListenerKind;
use crate::front::worker::Worker;
use crate::io::buf::Buf;
use crate::io::conn::Stream;
use crate::policy::Listener;

/// After an accept error such as EMFILE, wait this long before accepting again instead
/// of spinning on a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Takes one connection: a non-blocking socket, not yet registered with the event loop.
fn accept_one(
    listener: &std::net::TcpListener,
) -> std::io::Result<(std::net::TcpStream, SocketAddr)> {
    let (s, addr) =
        socket2::SockRef::from(listener).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
    let peer = addr.as_socket().ok_or_else(|| std::io::Error::other("accepted a non-IP socket"))?;
    Ok((s.into(), peer))
}

/// Accepts on one listener until shutdown. Sockets are taken with accept4 rather than
/// through tokio's listener, which would register each with epoll at once: plain HTTP
/// connections start unregistered (`conn::Stream::Fresh`).
pub(super) async fn accept_loop(
    worker: Rc<Worker>,
    config: Arc<Listener>,
    listener: Rc<AsyncFd<std::net::TcpListener>>,
) {
    let mut shutdown = worker.shutdown.clone();
    let mut failures = AcceptFailures::default();
    let mut refusals = Refusals::default();
    loop {
        let accepted = tokio::select! {
            r = listener.async_io(Interest::READABLE, accept_one) => r,
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                failures.failed(config.listen, &e);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if failures.in_a_row > 0 {
            failures.recovered(config.listen);
        }
        // The one branch a listener without `proxy_protocol` pays.
        if config.proxy_protocol.is_some() {
            // A source that may not send a header costs no task and one line a second.
            if !config.proxy_protocol_from.iter().any(|c| c.contains(peer.ip())) {
                crate::telemetry::metrics::refused(
                    &config.counters,
                    crate::telemetry::metrics::Refused::Rule,
                );
                let why = "not an address allowed to send a PROXY protocol header \
                           (proxy_protocol_from)";
                refusals.refused(config.listen, &format_args!("{peer}: {why}"));
                crate::front::dispatch::log_failure(&worker, &config, peer, Instant::now(), why);
                continue;
            }
            // Counted from now, under the balancer's address until its header names the
            // client: connections waiting for a header are bounded by the same limits.
            let (guard, open, over_client) = worker.admit(peer.ip(), &config);
            if open > worker.cfg().limits.max_connections || over_client {
                crate::telemetry::metrics::refused(
                    &config.counters,
                    crate::telemetry::metrics::Refused::Limit,
                );
                refusals.refused(config.listen, &format_args!("{peer}: {open} connections open"));
                let why = "too many connections waiting for their PROXY protocol header";
                crate::front::dispatch::log_failure(&worker, &config, peer, Instant::now(), why);
                continue;
            }
            tokio::task::spawn_local(proxied(guard, config.clone(), stream, peer));
            continue;
        }
        let (guard, open, over_client) = worker.admit(peer.ip(), &config);
        let l = config.clone();
        let overloaded = open > worker.cfg().limits.max_connections || over_client;
        if config.kind == ListenerKind::Http {
            let stream = Stream::Fresh(Some(stream));
            if overloaded {
                tokio::task::spawn_local(crate::front::http1::refuse_overloaded(
                    guard, l, stream, peer,
                ));
            } else {
                tokio::task::spawn_local(crate::front::dispatch::serve_fresh(
                    guard, l, stream, peer,
                ));
            }
            continue;
        }
        if config.kind == ListenerKind::Auto && !overloaded {
            let stream = Stream::Fresh(Some(stream));
            tokio::task::spawn_local(crate::front::dispatch::serve_auto(guard, l, stream, peer));
            continue;
        }
        // Every other kind waits on the socket at once: register it now.
        let stream = match TcpStream::from_std(stream) {
            Ok(s) => s,
            Err(e) => {
                // Out of epoll room or memory: pause as after a failed accept.
                failures.failed(config.listen, &format_args!("{peer}: cannot register: {e}"));
                drop(guard);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if overloaded {
            if config.kind == ListenerKind::Auto {
                tokio::task::spawn_local(crate::front::dispatch::refuse_auto(
                    guard, l, stream, peer,
                ));
            } else {
                crate::telemetry::metrics::refused(
                    &config.counters,
                    crate::telemetry::metrics::Refused::Limit,
                );
                tracing::warn!("{peer}: refused, {open} connections open");
                let why = "too many connections";
                crate::front::dispatch::log_failure(
                    &worker,
                    &l,
                    peer,
                    std::time::Instant::now(),
                    why,
                );
            }
            continue;
        }
        match config.kind {
            ListenerKind::Http => {}
            ListenerKind::Socks => {
                tokio::task::spawn_local(crate::front::socks::serve(
                    guard,
                    l,
                    stream,
                    peer,
                    Buf::default(),
                ));
            }
            // Served above, unregistered.
            ListenerKind::Auto => {}
            ListenerKind::Relay => {
                tokio::task::spawn_local(crate::front::portmap::serve(guard, l, stream, peer));
            }
            ListenerKind::Https => {
                tokio::task::spawn_local(crate::front::dispatch::serve_https(
                    guard, l, stream, peer,
                ));
            }
            // UDP listeners have no accept loop.
            ListenerKind::UdpRelay => {}
        }
    }
}

/// A connection on a listener with `proxy_protocol`, from one of `proxy_protocol_from`
/// (the accept loop refuses the others) and counted under that address: its header,
/// read before anything else within the handshake timeout, names the client that rules,
/// limits, logs and metrics see (a LOCAL or UNKNOWN header leaves the balancer's
/// address). Only then does its per-client slot move to that client, and it is served
/// as its listener's kind.
async fn proxied(
    mut guard: crate::front::worker::ConnGuard,
    config: Arc<Listener>,
    stream: std::net::TcpStream,
    peer: SocketAddr,
) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let accepted = tokio::time::Instant::now();
    let refuse = |why: &str| {
        tracing::warn!("{peer}: refused on {}: {why}", config.listen);
        crate::front::dispatch::log_failure(&worker, &config, peer, start, why);
    };
    let Some(version) = config.proxy_protocol else { return };
    let mut stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(e) => return refuse(&format!("cannot register: {e}")),
    };
    let read = read_proxy_header(&mut stream, version.accept());
    let deadline = accepted + worker.cfg().timeouts.handshake;
    let client = match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(header)) => header.addresses.source().unwrap_or(peer),
        Ok(Err(why)) => return refuse(&why),
        Err(_) => return refuse("no complete PROXY protocol header within the handshake timeout"),
    };
    // The connection goes on in this task: a second `spawn_local` site for each front
    // end's future would cost every accepted connection its inlining (and a copy of the
    // future), and this task is no larger than the front end's own.
    // Counted since the accept (`open`); the client's own limit from now on.
    let overloaded = !worker.move_client(&mut guard, client.ip());
    let l = config.clone();
    if overloaded {
        match config.kind {
            ListenerKind::Http => {
                crate::front::http1::refuse_overloaded(guard, l, Stream::Tcp(stream), client).await
            }
            ListenerKind::Auto => {
                crate::front::dispatch::refuse_auto(guard, l, stream, client).await
            }
            _ => {
                crate::telemetry::metrics::refused(
                    &config.counters,
                    crate::telemetry::metrics::Refused::Limit,
                );
                tracing::warn!("{client} (via {peer}): refused, over its connection limit");
                crate::front::dispatch::log_failure(
                    &worker,
                    &l,
                    client,
                    start,
                    "too many connections for this client address",
                );
            }
        }
        return;
    }
    // The TLS handshake has what is left of the header's deadline: the front end takes
    // it before its first wait (and only these two start a handshake at once).
    if config.kind == ListenerKind::Https
        || (config.kind == ListenerKind::Relay && config.tls.is_some())
    {
        worker.handshake_from(accepted);
    }
    match config.kind {
        ListenerKind::Http => {
            crate::front::dispatch::serve_fresh(guard, l, Stream::Tcp(stream), client).await
        }
        ListenerKind::Auto => {
            crate::front::dispatch::serve_auto(guard, l, Stream::Tcp(stream), client).await
        }
        ListenerKind::Socks => {
            crate::front::socks::serve(guard, l, stream, client, Buf::default()).await
        }
        ListenerKind::Relay => crate::front::portmap::serve(guard, l, stream, client).await,
        ListenerKind::Https => crate::front::dispatch::serve_https(guard, l, stream, client).await,
        ListenerKind::UdpRelay => {}
    }
}

/// Reads exactly the PROXY protocol header off `stream`, leaving the client's own bytes
/// in the socket: the header is peeked (a balancer writes it in one piece, so once,
/// nearly always), then read. A peek that finds part of a header tells the event loop the
/// socket is drained (`try_io` on `WouldBlock`), so the task sleeps until more bytes
/// arrive: no timer, no spinning on the same bytes. A peer that has closed its side
/// after part of a header stays readable for good: that is an error at once, not a
/// loop. An error is the reason to log.
async fn read_proxy_header(
    stream: &mut TcpStream,
    accept: rustle_proto::proxy_protocol::Accept,
) -> Result<rustle_proto::proxy_protocol::Header, String> {
    use rustle_proto::proxy_protocol::{parse, MAX_HEADER};
    use std::os::fd::AsFd as _;
    use tokio::io::AsyncReadExt;
    const CLOSED: &str = "closed before a complete PROXY protocol header";
    let failed = |e: std::io::Error| format!("reading its PROXY header: {e}");
    // On the heap: these connections are the balancer's, and the future stays small.
    let mut buf = vec![0u8; MAX_HEADER];
    let (header, len) = loop {
        let ready = stream.ready(Interest::READABLE).await.map_err(failed)?;
        let peeked = stream.try_io(Interest::READABLE, || {
            let n = crate::io::sys::peek(stream.as_fd(), &mut buf)?;
            if n == 0 {
                return Ok(Err(CLOSED.to_string()));
            }
            match parse(&buf[..n], accept) {
                Ok(Some(found)) => Ok(Ok(found)),
                // Part of a header: readiness is cleared, the next bytes wake us.
                Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                Err(e) => Ok(Err(e.to_string())),
            }
        });
        match peeked {
            Ok(result) => break result?,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if ready.is_read_closed() {
                    return Err(CLOSED.into());
                }
            }
            Err(e) => return Err(failed(e)),
        }
    };
    stream.read_exact(&mut buf[..len]).await.map_err(failed)?;
    Ok(header)
}

/// One warning a second at most about one listener (of a worker), with the count of
/// those held back since the last.
#[derive(Default)]
struct Throttled {
    unlogged: u64,
    logged: Option<Instant>,
}

impl Throttled {
    /// Whether a line is due now: Some(how many were held back since the last line).
    fn due(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.logged.is_some_and(|t| now.duration_since(t) < ACCEPT_FAILURE_LOG_EVERY) {
            self.unlogged += 1;
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// Connections of one listener (of a worker) refused at accept.
#[derive(Default)]
struct Refusals(Throttled);

impl Refusals {
    fn refused(&mut self, listen: SocketAddr, why: &dyn std::fmt::Display) {
        match self.0.due() {
            None => {}
            Some(0) => tracing::warn!("refused on {listen}: {why}"),
            Some(n) => tracing::warn!("refused on {listen}: {why} ({n} more not logged)"),
        }
    }
}

/// Least time between two log lines about failed accepts on one listener (of a worker).
const ACCEPT_FAILURE_LOG_EVERY: Duration = Duration::from_secs(1);

/// Failed accepts of one listener in one worker. At the file limit every retry fails
/// (ten a second, see `ACCEPT_BACKOFF`): one line a second says so, with the count of
/// those not logged, and one more says when accepting works again.
#[derive(Default)]
struct AcceptFailures {
    /// Failures since the last successful accept.
    in_a_row: u64,
    lines: Throttled,
}

impl AcceptFailures {
    fn failed(&mut self, listen: SocketAddr, e: &dyn std::fmt::Display) {
        self.in_a_row += 1;
        match self.lines.due() {
            None => {}
            Some(0) => tracing::warn!("accept on {listen}: {e}; pausing"),
            Some(n) => {
                tracing::warn!("accept on {listen}: {e}; pausing ({n} more failures not logged)")
            }
        }
    }

    fn recovered(&mut self, listen: SocketAddr) {
        tracing::info!("accept on {listen}: accepting again after {} failures", self.in_a_row);
        *self = AcceptFailures::default();
    }
}
