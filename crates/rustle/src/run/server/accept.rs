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

/// Least time between two log lines about failed accepts on one listener (of a worker).
const ACCEPT_FAILURE_LOG_EVERY: Duration = Duration::from_secs(1);

/// Failed accepts of one listener in one worker. At the file limit every retry fails
/// (ten a second, see `ACCEPT_BACKOFF`): one line a second says so, with the count of
/// those not logged, and one more says when accepting works again.
#[derive(Default)]
struct AcceptFailures {
    /// Failures since the last successful accept.
    in_a_row: u64,
    /// Failures since the last line.
    unlogged: u64,
    logged: Option<Instant>,
}

impl AcceptFailures {
    fn failed(&mut self, listen: SocketAddr, e: &dyn std::fmt::Display) {
        self.in_a_row += 1;
        let now = Instant::now();
        if self.logged.is_some_and(|t| now.duration_since(t) < ACCEPT_FAILURE_LOG_EVERY) {
            self.unlogged += 1;
            return;
        }
        match self.unlogged {
            0 => tracing::warn!("accept on {listen}: {e}; pausing"),
            n => tracing::warn!("accept on {listen}: {e}; pausing ({n} more failures not logged)"),
        }
        self.logged = Some(now);
        self.unlogged = 0;
    }

    fn recovered(&mut self, listen: SocketAddr) {
        tracing::info!("accept on {listen}: accepting again after {} failures", self.in_a_row);
        *self = AcceptFailures::default();
    }
}
