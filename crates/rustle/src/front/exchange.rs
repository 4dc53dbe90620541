//! What every front end shares about an exchange: the one connect step (`connect`: a
//! pooled connection or a new one, given up as soon as the client leaves), writing to an
//! upstream within the I/O timeout, reading an origin's response head while watching
//! whether the client has left, and the one way an exchange ends (`end`: the user's
//! traffic, the metrics, the access-log line, from one `accesslog::Record`). Front ends
//! depend on this module; it depends on none of them.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use rustle_proto::http::{parse_response, rewrite_for_hop, Method, NextHop, ResponseHead};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::{Error, Phase};
use crate::front::worker::Worker;
use crate::io::body;
use crate::io::buf::Buf;
use crate::io::conn::Stream;
use crate::policy::Policy;
use crate::telemetry::accesslog::{Record, Via};
use crate::upstream::{Connected, Key, Plan, Start, Want};

/// Why a request is answered 502 rather than sent again on a new connection.
pub(crate) const NOT_RETRIED: &str =
    "without responding; a request that is not idempotent is not sent a second time";

/// Reads until a whole response head is in `ubuf` and parsed into `rhead`, for a client
/// that may leave meanwhile: `client` ends with the error to return when it has (HTTP/1:
/// `client_left`; HTTP/2: a reset of the stream), and then the wait ends at once, and the
/// origin connection with it. The client is looked at only
/// once the origin has taken a tick (100-200 ms) to answer: a prompt answer costs no more
/// than an unwatched one.
pub(crate) async fn read_response_head_or<R, W>(
    worker: &Worker,
    r: &mut R,
    ubuf: &mut Buf,
    rhead: &mut ResponseHead,
    method: Method,
    idle: Duration,
    mut client: Option<Pin<&mut W>>,
) -> Result<(), Error>
where
    R: AsyncRead + Unpin,
    W: Future<Output = Error>,
{
    let limits = rustle_proto::http::Limits::default();
    let mut watching = false;
    loop {
        if !ubuf.is_empty() {
            match parse_response(ubuf.filled(), &limits, method, rhead) {
                Ok(Some(())) => return Ok(()),
                Ok(None) => {}
                Err(e) => return Err(Error::BadResponse(e)),
            }
        }
        // The origin is usually still working on the answer: a coarse deadline from the
        // worker's tick, not a timer per request.
        let read = {
            let read = std::pin::pin!(ubuf.read_from(r, limits.max_head));
            let waiters = &worker.waiters;
            let full = waiters.deadline(idle);
            let early = client.is_some() && !watching;
            let first = if early { waiters.deadline(Duration::ZERO) } else { full };
            let mut read = Watched {
                wait: waiters.within(read, first),
                client: client.as_mut().map(|c| c.as_mut()),
                full: early.then_some(full),
            };
            let result = (&mut read).await;
            // Past the first tick, the client is watched from the start of each read.
            watching |= early && read.full.is_none();
            result?
        };
        let n = match read {
            Some(Ok(n)) => n,
            Some(Err(e)) if e.kind() == std::io::ErrorKind::OutOfMemory => {
                return Err(Error::BadResponse(rustle_proto::http::HeadError::HeadTooLarge))
            }
            Some(Err(e)) => return Err(Error::Upstream(e)),
            None => return Err(Error::Timeout(Phase::UpstreamHead)),
        };
        if n == 0 {
            return Err(Error::UpstreamClosed(if ubuf.is_empty() {
                "without responding"
            } else {
                "in the middle of the response head"
            }));
        }
    }
}

/// A read from the origin within the I/O timeout (`Waiters::within`: a coarse deadline,
/// registered only if the read has to wait), which after its first tick also watches
/// `client`, whose end ends it with its error. One small future (no timer, nothing boxed):
/// it lives in every HTTP connection's state.
struct Watched<'a, F, W> {
    wait: crate::io::idle::Wait<'a, F>,
    client: Option<Pin<&'a mut W>>,
    /// While the first tick runs: the I/O deadline to move to once it has passed.
    full: Option<tokio::time::Instant>,
}

impl<F: Future + Unpin, W: Future<Output = Error>> Future for Watched<'_, F, W> {
    type Output = Result<Option<F::Output>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            match Pin::new(&mut this.wait).poll(cx) {
                Poll::Ready(Some(r)) => return Poll::Ready(Ok(Some(r))),
                Poll::Ready(None) => match this.full.take() {
                    Some(deadline) => {
                        this.wait.rearm(deadline);
                        continue;
                    }
                    None => return Poll::Ready(Ok(None)),
                },
                Poll::Pending => {}
            }
            if let (None, Some(client)) = (this.full, this.client.as_mut()) {
                if let Poll::Ready(e) = client.as_mut().poll(cx) {
                    return Poll::Ready(Err(e));
                }
            }
            return Poll::Pending;
        }
    }
}

/// Ends when the client has left (end of stream or a failed socket) while its exchange
/// waits on the upstream. What it sends meanwhile (a pipelined request, a tunnel's first
/// bytes) is kept in `buf` for its turn; once `buf` holds `max` bytes the client is no
/// longer read. For an HTTP exchange any end of stream counts as leaving (as squid and
/// nginx take it); for a `tunnel` only one before any byte does: a client that sent
/// something and then ended its side waits for the answer, and the tunnel passes the end
/// on once it is up.
pub(crate) async fn client_left<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Buf,
    max: usize,
    phase: Phase,
    tunnel: bool,
) -> Error {
    loop {
        match buf.read_from(r, max).await {
            Ok(0) if tunnel && !buf.is_empty() => return std::future::pending().await,
            Ok(0) => return Error::ClientLeft(phase),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => {
                return std::future::pending().await
            }
            Err(e) => return Error::Client(e),
        }
    }
}

/// Runs `connect` (an upstream connection being made: resolving, connecting, a TLS
/// handshake; boxed by the caller, as its state is large and this is not the pooled path)
/// unless the client leaves first: `left` makes the watch on the client (`client_left`),
/// whose error then ends the attempt at once. As with the origin's answer (`Watched`), the
/// client is looked at only once the attempt has taken a tick (100-200 ms): an attempt
/// that succeeds promptly costs nothing more, and the watch is boxed only for a slow one.
async fn unless_left<T, W>(
    worker: &Worker,
    mut connect: impl Future<Output = Result<T, Error>> + Unpin,
    left: impl FnOnce() -> W,
) -> Result<T, Error>
where
    W: Future<Output = Error>,
{
    let waiters = &worker.waiters;
    if let Some(r) = waiters.within(&mut connect, waiters.deadline(Duration::ZERO)).await {
        return r;
    }
    let mut left = Box::pin(left());
    std::future::poll_fn(|cx| match Pin::new(&mut connect).poll(cx) {
        Poll::Ready(r) => Poll::Ready(r),
        Poll::Pending => left.as_mut().poll(cx).map(Err),
    })
    .await
}

/// The connect step of every front end: the access rules and a pooled connection under
/// `key` when there is one (`Upstreams::start`), or else a new one (`attempt`), given up
/// as soon as the client leaves (`left` makes the watch on it, as for `unless_left`).
pub(crate) async fn connect<W: Future<Output = Error>>(
    worker: &Worker,
    policy: &Policy,
    want: &Want<'_>,
    key: Option<Key<'_>>,
    left: impl FnOnce() -> W,
) -> Result<Connected, Error> {
    match worker.upstreams.start(policy, want, key)? {
        Start::Ready(c) => Ok(c),
        Start::Connect(plan) => attempt(worker, policy, want, plan, left).await,
    }
}

/// A new upstream connection as `plan` says, unless the client leaves first
/// (`unless_left`). The connection attempt is boxed, on this path only: its state
/// (resolver, Happy Eyeballs, handshakes) would otherwise enlarge every connection's
/// future, and a new connection costs far more than one allocation. The watch on the
/// client stays outside the box, which so stays in malloc's small bins.
pub(crate) async fn attempt<'a, W: Future<Output = Error> + 'a>(
    worker: &'a Worker,
    policy: &'a Policy,
    want: &'a Want<'a>,
    plan: Plan<'a>,
    left: impl FnOnce() -> W + 'a,
) -> Result<Connected, Error> {
    let cfg = worker.cfg();
    let connect = Box::pin(worker.upstreams.connect(policy, want, plan, &cfg.timeouts));
    unless_left(worker, connect, left).await
}

/// The end of an exchange (a request, a tunnel, a refused connection), the one way every
/// front end ends one: its bytes to the user's traffic (`traffic`: the user's counters
/// when the caller holds them, else found by the record's user), then the metrics and the
/// access-log line when something reads them (each in a function of its own, so that an
/// exchange neither counted nor logged costs two tests). `cause`: the error it ended
/// with, which gives the line its error, refusal and failed route.
#[inline]
pub(crate) fn end(
    worker: &Worker,
    traffic: Option<&crate::limits::UserTraffic>,
    record: Record<'_>,
    cause: Option<&Error>,
) {
    use crate::limits::Direction;
    let found;
    let traffic = match (traffic, record.user) {
        (Some(t), _) => Some(t),
        (None, Some(user)) => {
            found = worker.traffic.entry(user);
            Some(&*found)
        }
        (None, None) => None,
    };
    // A user cut (`limits::cut`): the sweep ended its connection, and its line says why.
    let mut cut = None;
    if let Some(t) = traffic {
        t.add(Direction::Up, record.up.saturating_sub(record.counted.0));
        t.add(Direction::Down, record.down.saturating_sub(record.counted.1));
        if t.is_cut() {
            cut = t.cut_reason();
        } else if !matches!(cause, Some(Error::QuotaExceeded(_))) {
            // Out of a quota that closes connections: the sweep ends them (a refusal
            // says so itself).
            cut = t.quota_cut();
        }
    }
    if crate::telemetry::metrics::timed() {
        count(&record, cause);
    }
    if worker.log.enabled() {
        write_log(worker, record, cause, cut);
    }
}

#[inline(never)]
fn count(r: &Record<'_>, cause: Option<&Error>) {
    use crate::protocol::Protocol;
    // Protocols without statuses give 200 for a tunnel or session that was set up, and
    // their error's HTTP status otherwise (0: none, the client left, or the failure is
    // no `Error`).
    let status = match r.protocol {
        Protocol::Http | Protocol::Connect => r.status,
        _ if r.tunnel => 200,
        _ => match cause {
            Some(e) => e.status().unwrap_or(0),
            None if r.error.is_some() => 0,
            None => 200,
        },
    };
    crate::telemetry::metrics::ended(&crate::telemetry::metrics::End {
        listener: r.counters,
        protocol: r.protocol,
        version: r.version,
        status,
        up: r.up,
        down: r.down,
        user: r.user,
        refused: cause.and_then(Error::refusal),
        tunnel: r.tunnel.then_some(r.start),
        start: r.start,
        through: r.via.map(|v| &v.through),
    });
}

#[inline(never)]
fn write_log(
    worker: &Worker,
    r: Record<'_>,
    cause: Option<&Error>,
    cut: Option<crate::limits::Cut>,
) {
    // A connection through parents that failed to be made: its route and parent.
    let failed = match r.via {
        None => cause.and_then(Via::failed),
        Some(_) => None,
    };
    let cut = cut.map(|c| format!("connection cut: {c}"));
    let error = match &cut {
        Some(c) => Some(c as &dyn std::fmt::Display),
        None => r.error.or(cause.map(|e| e as &dyn std::fmt::Display)),
    };
    let record = Record {
        via: r.via.or(failed.as_ref()),
        error,
        refused: cause.and_then(Error::refusal),
        ..r
    };
    worker.log.log(&record);
}

/// Writes to the upstream with the I/O timeout.
pub(crate) async fn write_timed<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    idle: std::time::Duration,
) -> Result<(), Error> {
    match body::write_all_timed(w, bytes, idle).await {
        Ok(()) => Ok(()),
        Err(Some(e)) => Err(Error::Upstream(e)),
        Err(None) => Err(Error::Timeout(Phase::UpstreamHead)),
    }
}

/// What a front end brings to sending a request upstream (`send`).
pub(crate) trait Requester {
    /// Ends, with the error to give, when the client has left while the origin prepares
    /// its answer (HTTP/1: `client_left`; HTTP/2: the stream's reset).
    fn left(&mut self) -> impl Future<Output = Error> + '_;

    /// A new connection to the same target by the same route, for a request whose pooled
    /// connection was found dead.
    fn reconnect(&mut self) -> impl Future<Output = Result<Connected, Error>> + '_;
}

/// The upstream connection an exchange runs on.
pub(crate) struct Leg {
    pub(crate) stream: Stream,
    pub(crate) addr: std::net::SocketAddr,
    /// Taken from the pool.
    pub(crate) reused: bool,
    /// Where it goes back to the pool (None: the caller's key).
    pub(crate) pool_key: Option<Box<[u8]>>,
    /// How the request was written (`Connected::absolute`): None for its origin (or a
    /// tunnel to it); in absolute form to an HTTP parent, with that parent's
    /// `Proxy-Authorization` value when it has credentials.
    pub(crate) absolute: Option<Option<Box<[u8]>>>,
    /// The route and parents taken, for the log (a retry may take others).
    pub(crate) via: Option<std::rc::Rc<crate::telemetry::accesslog::Via>>,
    /// Through parents: a fresh connection that dies before any byte of an answer may be
    /// a parent that just went down, and an idempotent request is sent once more, by a
    /// new pick (which passes over a parent marked down).
    pub(crate) through_parents: bool,
}

/// The request's facts that decide how it is sent and retried.
pub(crate) struct Outgoing<'a> {
    /// The head, with the body bytes that fit beside it (written again in place for a
    /// new connection's hop).
    pub(crate) out: &'a mut Vec<u8>,
    /// Nothing of the body is left to stream after `out`.
    pub(crate) whole: bool,
    /// How the response is framed (only HEAD differs).
    pub(crate) method: Method,
    /// Its method may be sent twice (RFC 9110 9.2.2).
    pub(crate) idempotent: bool,
}

/// Sends a request's head (and the body bytes in hand) on `leg` and, when the request
/// went out whole, reads the response head into `ubuf` and `rhead` while the client is
/// watched. A pooled connection found dead before any byte of an answer is replaced
/// (`Requester::reconnect`) and an idempotent request sent again; any other request may
/// have had its effect and gets a 502 that says it was not repeated. One path for
/// HTTP/1 and HTTP/2 clients.
pub(crate) async fn send<R: Requester>(
    worker: &Worker,
    leg: &mut Leg,
    client: &mut R,
    req: &mut Outgoing<'_>,
    ubuf: &mut Buf,
    rhead: &mut ResponseHead,
    io: Duration,
) -> Result<(), Error> {
    let mut fresh_retry = leg.through_parents;
    // Read from the clock only while something reads the durations (`metrics::timed`).
    let started = crate::telemetry::metrics::timed().then(std::time::Instant::now);
    loop {
        let sent = write_timed(&mut leg.stream, req.out, io).await;
        let result = match sent {
            Ok(()) if req.whole => {
                let left = std::pin::pin!(client.left());
                let up = &mut leg.stream;
                read_response_head_or(worker, up, ubuf, rhead, req.method, io, Some(left)).await
            }
            other => other,
        };
        let dead = matches!(result, Err(Error::Upstream(_) | Error::UpstreamClosed(_)));
        match result {
            Ok(()) => {
                if let Some(started) = started {
                    crate::telemetry::metrics::response_head(started.elapsed());
                }
                return Ok(());
            }
            Err(_) if dead && (leg.reused || fresh_retry) && ubuf.is_empty() => {
                if !leg.reused {
                    fresh_retry = false;
                }
                if !req.idempotent {
                    return Err(Error::UpstreamClosed(NOT_RETRIED));
                }
                tracing::debug!(
                    "connection to {} was dead before answering; reconnecting",
                    leg.addr
                );
                let fresh = client.reconnect().await?;
                if fresh.absolute != leg.absolute {
                    // A new pick of parents: the head is the new hop's (its form, its
                    // parent's credentials), never the one written for the old hop.
                    let hop = match &fresh.absolute {
                        None => NextHop::Origin,
                        Some(auth) => NextHop::Proxy(auth.as_deref()),
                    };
                    let mut again = Vec::with_capacity(req.out.len() + 64);
                    if rewrite_for_hop(req.out, hop, &mut again).is_none() {
                        return Err(Error::UpstreamClosed(NOT_RETRIED));
                    }
                    *req.out = again;
                }
                *leg = Leg {
                    stream: fresh.stream,
                    addr: fresh.addr,
                    reused: false,
                    through_parents: fresh.via.is_some(),
                    pool_key: fresh.pool_key,
                    absolute: fresh.absolute,
                    via: fresh.via,
                };
            }
            Err(e) => return Err(e),
        }
    }
}

/// How many origin connections one client connection may hold pinned (one per target);
/// a further pin closes the oldest. A client doing connection-based authentication
/// talks to one or two servers; the bound keeps a hostile one from holding many sockets
/// (pinned connections are idle between its requests, outside the pool's bounds).
const MAX_PINS: usize = 2;

/// An origin connection bound to one client connection (HTTP/1: the connection; HTTP/2:
/// all its streams). Once a request on it carried connection-based credentials
/// (`Authorization: NTLM` or `Negotiate`) or the origin asked for them, the origin
/// authenticates the connection rather than each request: another client riding it
/// would be served as this one. So it is never pooled: it waits for the same client
/// connection's next request to the same target, and closes when that connection ends
/// (as squid pins it, and as haproxy's `http-reuse safe` keeps it private).
pub(crate) struct Pinned {
    /// The target's key as the front end makes it for the pool (`host:port` lowercased,
    /// TLS origins after their scheme).
    pub(crate) key: Box<[u8]>,
    pub(crate) stream: Stream,
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) via: Option<std::rc::Rc<crate::telemetry::accesslog::Via>>,
    pub(crate) pool_key: Option<Box<[u8]>>,
    pub(crate) absolute: Option<Option<Box<[u8]>>>,
}

/// A client connection's pinned origin connections: one word, and no allocation, until
/// one is pinned.
// The box is the point: one word in every HTTP connection's state rather than a Vec's
// three, for what few connections ever hold.
#[allow(clippy::box_collection)]
#[derive(Default)]
pub(crate) struct Pins(Option<Box<Vec<Pinned>>>);

impl Pins {
    /// The connection pinned to this client for target `key`, if there is a live one, as
    /// a reused connection (one that turns out dead is replaced as a pooled one would
    /// be). Its address is vetted by the access rules again, as a pooled connection's is.
    /// Costs a check for none when nothing is pinned.
    pub(crate) fn take(
        &mut self,
        key: &[u8],
        policy: &crate::policy::Policy,
        want: &crate::upstream::Want<'_>,
    ) -> Result<Option<Connected>, Error> {
        let Some(pins) = self.0.as_deref_mut() else { return Ok(None) };
        let Some(i) = pins.iter().position(|p| *p.key == *key) else { return Ok(None) };
        let mut pin = pins.swap_remove(i);
        if crate::upstream::is_stale(pin.stream.socket()) {
            pin.stream.close_now();
            return Ok(None);
        }
        if let Some(d) = want.check(policy, pin.addr) {
            pin.stream.close_now();
            return Err(Error::Connect(crate::error::ConnectError::Denied(d)));
        }
        Ok(Some(Connected {
            stream: pin.stream,
            addr: pin.addr,
            reused: true,
            via: pin.via,
            pool_key: pin.pool_key,
            absolute: pin.absolute,
            early: Vec::new(),
            private: true,
        }))
    }

    /// Whether a connection is pinned for target `key`.
    pub(crate) fn holds(&self, key: &[u8]) -> bool {
        self.0.as_deref().is_some_and(|pins| pins.iter().any(|p| *p.key == *key))
    }

    /// Keeps `pin` for this client connection (the oldest closed past `MAX_PINS`).
    pub(crate) fn keep(&mut self, pin: Pinned) {
        let pins = self.0.get_or_insert_with(Box::default);
        if pins.len() >= MAX_PINS {
            let mut oldest = pins.remove(0);
            oldest.stream.close_now();
        }
        pins.push(pin);
    }
}

/// Whether an `Authorization` or `WWW-Authenticate` value names a scheme that
/// authenticates the connection rather than the request: NTLM or Negotiate (RFC 4559),
/// in any case, alone or before its token.
pub(crate) fn is_connection_auth(value: &[u8]) -> bool {
    let value = value.trim_ascii_start();
    let scheme = value.split(|&b| b == b' ' || b == b'\t' || b == b',').next().unwrap_or_default();
    scheme.eq_ignore_ascii_case(b"NTLM") || scheme.eq_ignore_ascii_case(b"Negotiate")
}

#[cfg(test)]
mod tests {
    use super::is_connection_auth;

    #[test]
    fn connection_auth_schemes() {
        for (value, pins) in [
            (&b"NTLM TlRMTVNTUAABAAAA"[..], true),
            (b"ntlm", true),
            (b"Negotiate YIIB", true),
            (b"negotiate", true),
            (b"  NTLM x", true),
            (b"Negotiate, Basic realm=\"x\"", true),
            (b"Basic YTpi", false),
            (b"Bearer NTLM", false),
            (b"NTLMx", false),
            (b"", false),
        ] {
            assert_eq!(is_connection_auth(value), pins, "{:?}", String::from_utf8_lossy(value));
        }
    }
}
