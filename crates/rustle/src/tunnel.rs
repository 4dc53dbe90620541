//! Detached tunnels. Once a CONNECT, SOCKS, BIND, upgrade or port-relay connection is
//! established, the task that did the handshake ends and a small task that only relays
//! takes over: an open tunnel then keeps the relay's state (a few hundred bytes), not the
//! handshake's, and writes its one access-log line when it ends.

pub mod park;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::accesslog::{Entry, Protocol};
use crate::conn::Stream;
use crate::limits::Throttle;
use crate::relay::{self, Ended, Opts, Relay};
use crate::worker::ConnGuard;

/// What the handshake hands over besides the client socket.
pub struct Handoff {
    pub upstream: Stream,
    /// Client bytes read with the handshake that belong to the tunnel.
    pub early_up: Vec<u8>,
    /// Upstream bytes read with a response head that belong to the tunnel.
    pub early_down: Vec<u8>,
    /// Bandwidth limits of the listener and the user.
    pub throttle: Throttle,
}

/// What the tunnel's log line says about how it began.
pub struct Record {
    pub peer: SocketAddr,
    /// Method and target (and User-Agent and Referer when the log shows them), and the
    /// protocol.
    pub label: Label,
    pub status: u16,
    pub start: Instant,
    pub upstream: Option<SocketAddr>,
    /// The authenticated user.
    pub user: Option<std::rc::Rc<str>>,
    /// The client's TLS session, on TLS ports.
    pub tls: Option<std::rc::Rc<crate::tls::Session>>,
    /// The route and parents taken, if any.
    pub via: Option<std::rc::Rc<crate::accesslog::Via>>,
    /// Bytes already counted by the handshake (a 101 response's body bytes, say).
    pub up: u64,
    pub down: u64,
}

/// A log line's method, target, User-Agent and Referer in one allocation (none when all
/// are empty): an open tunnel keeps it for as long as it lasts.
pub struct Label {
    bytes: Box<[u8]>,
    /// Where the method, target and User-Agent end (the Referer ends with `bytes`).
    ends: [u16; 3],
    /// Beside the ends, where the label's allocation leaves room for it.
    pub protocol: Protocol,
}

/// The longest part a label keeps (a longer one is cut for the log).
const PART_MAX: usize = u16::MAX as usize / 4;

impl Label {
    pub fn new(protocol: Protocol, method: &[u8], target: &[u8]) -> Label {
        let mut label = Label::with_headers(method, target, b"", b"");
        label.protocol = protocol;
        label
    }

    /// A label with the request's User-Agent and Referer (empty when the log does not show
    /// them).
    pub fn with_headers(method: &[u8], target: &[u8], ua: &[u8], referer: &[u8]) -> Label {
        let parts = [method, target, ua, referer].map(|p| &p[..p.len().min(PART_MAX)]);
        let mut ends = [0u16; 3];
        let mut at = 0;
        for (end, part) in ends.iter_mut().zip(parts) {
            at += part.len();
            // At most 3 * PART_MAX: fits.
            *end = at as u16;
        }
        Label { bytes: parts.concat().into(), ends, protocol: Protocol::Unknown }
    }

    fn part(&self, i: usize) -> &[u8] {
        let from = if i == 0 { 0 } else { usize::from(self.ends[i - 1]) };
        let to = self.ends.get(i).map_or(self.bytes.len(), |&e| usize::from(e));
        self.bytes.get(from..to).unwrap_or_default()
    }

    pub fn method(&self) -> &[u8] {
        self.part(0)
    }

    pub fn target(&self) -> &[u8] {
        self.part(1)
    }

    pub fn user_agent(&self) -> &[u8] {
        self.part(2)
    }

    pub fn referer(&self) -> &[u8] {
        self.part(3)
    }

    /// Moves a short label out of its allocation (leaving this one empty), for a parked
    /// tunnel: a small allocation that outlives everything around it would keep a whole
    /// page of freed memory from going back to the kernel.
    pub fn pack(&mut self) -> Option<PackedLabel> {
        let len = u8::try_from(self.bytes.len()).ok().filter(|&n| usize::from(n) <= PACKED)?;
        let mut bytes = [0u8; PACKED];
        bytes[..self.bytes.len()].copy_from_slice(&self.bytes);
        // Each end is at most `len`, which fits a byte.
        let ends = self.ends.map(|e| e as u8);
        let protocol = self.protocol;
        *self = Label { bytes: Box::default(), ends: [0; 3], protocol };
        Some(PackedLabel { bytes, len, ends, protocol })
    }

    pub fn unpack(p: &PackedLabel) -> Label {
        let bytes = &p.bytes[..usize::from(p.len)];
        Label { bytes: bytes.into(), ends: p.ends.map(u16::from), protocol: p.protocol }
    }
}

/// Longest label a parked tunnel keeps inline.
const PACKED: usize = 59;

/// A label without an allocation (see `Label::pack`).
pub struct PackedLabel {
    bytes: [u8; PACKED],
    len: u8,
    ends: [u8; 3],
    protocol: Protocol,
}

/// Starts the relay task; the caller's task should end right after. Two plain sockets get
/// the socket relay (splice); a TLS stream on either side gets the stream relay.
pub fn spawn(guard: ConnGuard, mut client: Stream, handoff: Handoff, opts: Opts, record: Record) {
    let Handoff { upstream, early_up, early_down, throttle } = handoff;
    // A relay waits on both sockets: a client not yet registered is registered now.
    if let Err(e) = client.register() {
        tracing::warn!("{}: tunnel not started: {e}", record.peer);
        finish(&guard, &record, relay::Totals::default(), Err(crate::error::Error::Client(e)));
        return;
    }
    // The relay keeps its own copy of early bytes (in a pooled buffer) until delivered.
    match (client, upstream) {
        (Stream::Tcp(client), Stream::Tcp(upstream)) => {
            let mut relay = relay::run(client, upstream, &early_up, &early_down, opts).closing();
            if park::here() {
                relay = relay.parking();
            }
            tokio::task::spawn_local(socket_task(guard, relay.throttled(&throttle), record));
        }
        (client, upstream) => {
            let relay = relay::stream::run(client, upstream, &early_up, &early_down, opts);
            tokio::task::spawn_local(task(guard, relay.throttled(&throttle), record));
        }
    }
}

/// The task of an open tunnel. The relay is built before the task starts, so the task
/// keeps exactly the relay, the log record and the connection slot.
// Not an `async fn`: its arguments would be kept twice in the future (once as
// arguments, once as locals), doubling what every open tunnel holds.
#[allow(clippy::manual_async_fn)]
pub(crate) fn task<R>(guard: ConnGuard, mut relay: R, rec: Record) -> impl Future<Output = ()>
where
    R: Future<Output = (relay::Totals, Result<(), crate::error::Error>)> + Unpin,
{
    async move {
        // Polled in place (it is Unpin): awaiting it by value would move it into a
        // second slot of this future.
        let (totals, result) = (&mut relay).await;
        finish(&guard, &rec, totals, result);
        drop(guard);
    }
}

/// The task of an open tunnel between two plain sockets: when the relay has been idle
/// long enough, the tunnel is parked and this task ends (`park`).
#[allow(clippy::manual_async_fn)]
pub(crate) fn socket_task(
    guard: ConnGuard,
    mut relay: Relay<TcpStream, TcpStream>,
    rec: Record,
) -> impl Future<Output = ()> {
    async move {
        match std::future::poll_fn(|cx| relay.poll_ended(cx)).await {
            Ended::Done(totals, result) => {
                relay.pass_reset(&result);
                finish(&guard, &rec, totals, result);
                drop(guard);
            }
            Ended::Idle => park::park(guard, relay, rec),
        }
    }
}

/// A tunnel's end: its bytes to the user's traffic and the metrics, its access-log line.
pub(crate) fn finish(
    guard: &ConnGuard,
    rec: &Record,
    totals: relay::Totals,
    result: Result<(), crate::error::Error>,
) {
    // An upstream failure through parents names the parent it came through.
    let result = result.map_err(|e| e.through(rec.via.as_deref().map(crate::accesslog::Via::last_parent)));
    if let Some(u) = &rec.user {
        let t = guard.worker().traffic.entry(u);
        t.add(crate::limits::Direction::Up, rec.up + totals.up);
        t.add(crate::limits::Direction::Down, rec.down + totals.down);
    }
    use crate::metrics::Proto;
    // What the client spoke, from the log's protocol (an HTTP/1 tunnel is a CONNECT's
    // unless it began with 101 Switching Protocols). SOCKS and port relays have no
    // status: the tunnel was set up.
    let (proto, status) = match rec.label.protocol {
        Protocol::Http10 | Protocol::Http11 if rec.status == 101 => (Proto::Http1, 101),
        Protocol::Http10 | Protocol::Http11 => (Proto::Connect, rec.status),
        Protocol::Http2 => (Proto::Http2, rec.status),
        Protocol::Socks4 => (Proto::Socks4, 200),
        Protocol::Socks5 => (Proto::Socks5, 200),
        Protocol::Tcp => (Proto::Relay, 200),
        Protocol::Udp => (Proto::Udp, 200),
        Protocol::Unknown => (Proto::Other, 200),
    };
    crate::metrics::ended(&crate::metrics::End {
        listener: &guard.listener().counters,
        proto,
        status,
        up: rec.up + totals.up,
        down: rec.down + totals.down,
        user: rec.user.as_deref(),
        refused: None,
        tunnel: Some(rec.start),
        start: rec.start,
        through: rec.via.as_deref().map(|v| &v.through),
    });
    let log = &guard.worker().log;
    if log.enabled() {
        log.log(&Entry {
            client: rec.peer,
            listener: guard.listener(),
            protocol: rec.label.protocol,
            user_agent: rec.label.user_agent(),
            referer: rec.label.referer(),
            method: rec.label.method(),
            target: rec.label.target(),
            status: rec.status,
            up: rec.up + totals.up,
            down: rec.down + totals.down,
            start: rec.start,
            upstream: rec.upstream,
            error: result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
            refused: None,
            user: rec.user.as_deref(),
            tls: rec.tls.as_deref(),
            via: rec.via.as_deref(),
        });
    }
}
