//! Detached tunnels. Once a CONNECT, SOCKS, BIND, upgrade or port-relay connection is
//! established, the task that did the handshake ends and a small task that only relays
//! takes over: an open tunnel then keeps the relay's state (a few hundred bytes), not the
//! handshake's, and writes its one access-log line when it ends.

pub mod park;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::front::worker::ConnGuard;
use crate::io::conn::Stream;
use crate::io::relay::{self, Ended, Opts, Relay};
use crate::limits::Throttle;
pub(crate) use crate::telemetry::accesslog::{Label, PackedLabel};

/// What the handshake hands over besides the client socket.
pub(crate) struct Handoff {
    pub(crate) upstream: Stream,
    /// Client bytes read with the handshake that belong to the tunnel.
    pub(crate) early_up: Vec<u8>,
    /// Upstream bytes read with a response head that belong to the tunnel.
    pub(crate) early_down: Vec<u8>,
    /// Bandwidth limits of the listener and the user.
    pub(crate) throttle: Throttle,
    /// The user's traffic counters: the relay counts into them as bytes move.
    pub(crate) traffic: Option<std::sync::Arc<crate::limits::UserTraffic>>,
}

/// What an open tunnel keeps of its exchange for its record (`accesslog::Record`), ended
/// when the tunnel ends.
pub(crate) struct Record {
    pub(crate) peer: SocketAddr,
    /// Method and target (and User-Agent and Referer when the log shows them), with the
    /// protocol and HTTP version.
    pub(crate) label: Label,
    pub(crate) status: u16,
    pub(crate) start: Instant,
    pub(crate) upstream: Option<SocketAddr>,
    /// The authenticated user.
    pub(crate) user: Option<std::rc::Rc<str>>,
    /// The client's TLS session, on TLS ports.
    pub(crate) tls: Option<std::rc::Rc<crate::io::tls::Session>>,
    /// The route and parents taken, if any.
    pub(crate) via: Option<std::rc::Rc<crate::telemetry::accesslog::Via>>,
    /// Bytes the handshake moved (a request body ahead of a 101, say), already on the
    /// user's counters when there is a user.
    pub(crate) up: u64,
    pub(crate) down: u64,
}

/// Starts the relay task; the caller's task should end right after. Two plain sockets get
/// the relay with sockets as ends (splice, parking); a TLS stream on either side, the
/// relay with streams as ends.
pub(crate) fn spawn(
    guard: ConnGuard,
    mut client: Stream,
    handoff: Handoff,
    opts: Opts,
    record: Record,
) {
    let Handoff { upstream, early_up, early_down, throttle, traffic } = handoff;
    // Every tunnel of a user counts as it goes (`finish` counts only the rest).
    let traffic = match (traffic, &record.user) {
        (Some(t), _) => Some(t),
        (None, Some(user)) => Some(guard.worker().traffic.entry(user)),
        (None, None) => None,
    };
    // A relay waits on both sockets: a client not yet registered is registered now.
    if let Err(e) = client.register() {
        tracing::warn!("{}: tunnel not started: {e}", record.peer);
        finish(&guard, &record, relay::Totals::default(), Err(crate::error::Error::Client(e)));
        return;
    }
    // The relay keeps its own copy of early bytes (in a pooled buffer) until delivered.
    match (client, upstream) {
        (Stream::Tcp(client), Stream::Tcp(upstream)) => {
            let mut relay = relay::run(client, upstream, &early_up, &early_down, opts)
                .closing()
                .counting(traffic);
            if park::here() {
                relay = relay.parking();
            }
            // Where the kernel forwards, it takes the tunnel once early bytes are out;
            // a parked tunnel stays forwarded (the park's sweep looks at it).
            if relay.parks() {
                let mode = guard.worker().cfg().relay.kernel_forwarding;
                relay = relay.throttled(&throttle).forwarded(mode);
            } else {
                relay = relay.throttled(&throttle);
            }
            tokio::task::spawn_local(socket_task(guard, relay, record));
        }
        (client, upstream) => {
            let relay =
                relay::run(client, upstream, &early_up, &early_down, opts).counting(traffic);
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
        loop {
            match std::future::poll_fn(|cx| relay.poll_ended(cx)).await {
                Ended::Done(totals, result) => {
                    relay.pass_reset(&result);
                    finish(&guard, &rec, totals, result);
                    drop(guard);
                    return;
                }
                Ended::Idle => return park::park(guard, relay, rec),
                // A tunnel the kernel forwards, after a reload: its limits again.
                Ended::Reload => {
                    if let Some(throttle) = park::limits_now(&guard, &rec) {
                        relay.leave(&throttle);
                    }
                }
            }
        }
    }
}

/// A tunnel's end (`exchange::end`): its bytes to the user's traffic and the metrics, its
/// access-log line.
pub(crate) fn finish(
    guard: &ConnGuard,
    rec: &Record,
    totals: relay::Totals,
    result: Result<(), crate::error::Error>,
) {
    // An upstream failure through parents names the parent it came through.
    let via = rec.via.as_deref();
    let result =
        result.map_err(|e| e.through(via.map(crate::telemetry::accesslog::Via::last_parent)));
    let mut record = crate::telemetry::accesslog::Record::new(
        rec.peer,
        guard.listener(),
        &guard.listener().counters,
        rec.label.protocol,
        rec.start,
    );
    record.label(&rec.label);
    record.user = rec.user.as_deref();
    record.upstream = rec.upstream;
    record.via = via;
    record.status = rec.status;
    record.up = rec.up + totals.up;
    record.down = rec.down + totals.down;
    // A user's relay counted its bytes as they moved (`spawn`), and so did the handshake
    // before it (an HTTP/1 request body ahead of a 101: `body::Tally`).
    if rec.user.is_some() {
        record.counted = (rec.up + totals.up, rec.down + totals.down);
    }
    record.tunnel = true;
    record.tls = rec.tls.as_deref();
    crate::front::exchange::end(guard.worker(), None, record, result.as_ref().err());
}
