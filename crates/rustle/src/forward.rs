//! Forwarding one absolute-form request to its origin and the response back: an idle
//! pooled connection when there is one, the request head rewritten (origin-form target,
//! hop-by-hop fields removed), bodies streamed both ways, interim responses passed on,
//! and the origin connection parked for reuse when the exchange ended cleanly.

use rustle_proto::http::{
    parse_response, write_request, write_response, BodyKind, Method, RequestRewrite, ResponseHead,
    ResponseRewrite, Target,
};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::acl::Protocol;
use crate::body::{self, Dir, State};
use crate::buf::Buf;
use crate::config::SpliceMode;
use crate::conn::Stream;
use crate::error::{ConnectError, Error, Phase};
use crate::http1::{Client, Exchange, Next};
use crate::worker::Worker;
use crate::tunnel::Handoff;

/// A head and the body bytes that came with it are sent in one write while they fit in
/// this many bytes; larger bodies are streamed after the head.
const COALESCE: usize = 64 * 1024;

/// A timeout long enough never to fire, for waits bounded by something else.
const UNBOUNDED: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a request is answered 502 rather than sent again on a new connection.
pub(crate) const NOT_RETRIED: &str =
    "without responding; a request that is not idempotent is not sent a second time";

/// Name of this proxy in Via headers.
const VIA: &str = "rustle";

/// Pool keys of TLS origins start with this, so a plain connection is never reused for
/// an https:// URL or the other way round.
const HTTPS_KEY: &[u8] = b"https://";

/// A connection to the origin: pooled or new, with TLS originated for https:// URLs
/// (verified against `[tls] origin_ca` or the system's roots, the name sent as SNI).
async fn origin(
    c: &mut Client,
    key: Option<&[u8]>,
    host: &str,
    port: u16,
    https: bool,
) -> Result<(Stream, SocketAddr, bool), Error> {
    let (up, addr, reused) = c.upstream(key, host, port, Protocol::Http).await?;
    let tcp = match up {
        Stream::Tcp(tcp) if https => tcp,
        up => return Ok((up, addr, reused)),
    };
    let tls_error = |reason: String| Error::Connect(ConnectError::Tls { addr, reason });
    let config = c.worker.policy().https_origins().map_err(|e| tls_error(e.to_string()))?.clone();
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| tls_error(format!("`{host}` is not a server name")))?;
    let timeout = c.worker.cfg.timeouts.handshake;
    // Boxed: the handshake's state would otherwise enlarge every HTTP connection's future.
    let handshake = Box::pin(async {
        crate::tls::connect(config, name, tcp, timeout).await.map_err(tls_error)
    });
    let (stream, buf, max) = (&mut c.stream, &mut c.buf, c.worker.limits.max_head);
    let tls =
        unless_left(&c.worker, handshake, || client_left(stream, buf, max, Phase::Connect, false))
            .await?;
    Ok((tls, addr, false))
}

pub async fn forward(c: &mut Client, ex: &mut Exchange) -> Result<Next, Error> {
    let worker = c.worker.clone();
    let cfg = &worker.cfg;
    let Target::Absolute { host, port, scheme, .. } = c.head.target else {
        return Err(Error::Unsupported("not an absolute-form request"));
    };
    let https = scheme.is_tls();
    let head = &c.head;
    let filled = c.buf.filled();
    // The pool key, `host:port` lowercased (`https://host:port` for TLS origins), in a
    // buffer the connection reuses; the host for resolving is in it.
    let mut key = std::mem::take(&mut c.key);
    key.clear();
    if https {
        key.extend_from_slice(HTTPS_KEY);
    }
    let host_start = key.len();
    key.extend(host.get(filled).iter().map(u8::to_ascii_lowercase));
    let host_end = key.len();
    key.push(b':');
    rustle_proto::http::push_decimal(&mut key, u32::from(port));
    let host = std::str::from_utf8(&key[host_start..host_end])
        .map_err(|_| Error::Unsupported("the host name is not ASCII"))?;
    let upgrade = head.is_upgrade();
    let method = head.method;
    let client_keep_alive = head.keep_alive();
    let client_http10 = head.minor == 0;
    let expect_continue = head.expect_continue;
    let peer_text;
    let rw = RequestRewrite {
        via: cfg.http.via.then_some(VIA),
        forwarded_for: if cfg.http.forwarded_for {
            peer_text = c.peer.ip().to_string();
            Some(peer_text.as_str())
        } else {
            None
        },
        upgrade,
    };
    c.out.clear();
    write_request(head, filled, &rw, &mut c.out);
    let mut req_body = State::new(head.body);
    c.buf.consume(head.len);
    if !expect_continue {
        ex.up += body::coalesce(&mut c.buf, &mut req_body, &mut c.out, COALESCE, Dir::Up)?;
    }

    // An upstream: a pooled connection, or a new one.
    let (mut up, mut addr, mut reused) = origin(c, Some(&key), host, port, https).await?;
    ex.upstream = Some(addr);
    let mut ubuf = worker.take_buf();
    let mut rhead = ResponseHead::new();
    rhead.headers = worker.take_fields();
    let io = cfg.timeouts.io;

    // The request went out whole: a pooled connection that turns out to be dead before
    // any byte of an answer can be replaced and an idempotent request sent again (RFC 9110
    // 9.2.2); any other request may have had its effect, so it is not repeated.
    let whole = req_body.is_done();
    let max_head = worker.limits.max_head;
    loop {
        let sent = write_timed(&mut up, &c.out, io).await;
        let result = match sent {
            Ok(()) if whole => {
                let left = std::pin::pin!(client_left(
                    &mut c.stream,
                    &mut c.buf,
                    max_head,
                    Phase::UpstreamHead,
                    false
                ));
                let (ubuf, rhead) = (&mut ubuf, &mut rhead);
                read_response_head_or(&worker, &mut up, ubuf, rhead, method, io, Some(left)).await
            }
            Ok(()) => Ok(()),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => break,
            Err(Error::Upstream(_) | Error::UpstreamClosed(_)) if reused && ubuf.is_empty() => {
                if !method.is_idempotent() {
                    return Err(Error::UpstreamClosed(NOT_RETRIED));
                }
                tracing::debug!("pooled connection to {addr} was dead; reconnecting");
                let (s, a, _) = origin(c, None, host, port, https).await?;
                up = s;
                addr = a;
                reused = false;
                ex.upstream = Some(addr);
            }
            Err(e) => return Err(e),
        }
    }
    let _ = reused;

    let splice = c.listener.splice != SpliceMode::Never;
    let throttle = c.throttle();
    let limit_up = (!throttle.up.is_unlimited()).then_some(&throttle.up);
    let limit_down = (!throttle.down.is_unlimited()).then_some(&throttle.down);
    let outcome = {
        let out = &mut c.out;
        let cbuf = &mut c.buf;
        // No request body left and the whole answer in hand: the client side is only
        // written (a fresh connection stays unregistered unless a write blocks). An answer
        // still to come from the origin needs the read side too, to watch the client.
        let in_hand = whole && answer_in_hand(&rhead, &ubuf);
        let (mut cr, mut cw) = c.stream.halves(!in_hand);
        let (mut ur, mut uw) = up.split();
        // Stream the request body (if any is left) while watching for the response head.
        // The client's read side comes back with the result: once the body is done, it is
        // watched for the client leaving while the origin prepares its answer.
        let body_fut = async {
            let cr = &mut cr;
            if req_body.is_done() {
                return (Ok(0), cr, cbuf);
            }
            let r =
                body::copy(cr, cbuf, &mut uw, &mut req_body, Dir::Up, io, splice, limit_up).await;
            (r, cr, cbuf)
        };
        tokio::pin!(body_fut);
        let mut left = std::pin::pin!(None);
        let mut body_done = whole;
        let mut head_ready = whole;
        loop {
            if head_ready {
                head_ready = false;
                if (100..200).contains(&rhead.status) && rhead.status != 101 {
                    // Interim response (100 Continue and friends): pass it on, read on.
                    out.clear();
                    write_response(&rhead, ubuf.filled(), &ResponseRewrite::default(), out);
                    ubuf.consume(rhead.len);
                    write_timed(&mut cw, out, io).await.map_err(client_side)?;
                } else {
                    break;
                }
            }
            tokio::select! {
                (r, cr, cbuf) = &mut body_fut, if !body_done => {
                    ex.up += r?;
                    body_done = true;
                    // Boxed, on this path only (a body that did not come with its head), so
                    // that every HTTP connection's state does not grow by it.
                    let watch =
                        client_left_http(&worker, cr, cbuf, Phase::UpstreamHead, false);
                    left.set(Some(Box::pin(watch)));
                }
                // While the request body is still flowing, an origin that waits for all
                // of it before answering is not idle: the body copy has its own timeout.
                r = read_response_head_or(&worker, &mut ur, &mut ubuf, &mut rhead, method,
                                          if body_done { io } else { UNBOUNDED },
                                          left.as_mut().as_pin_mut()) => {
                    r?;
                    head_ready = true;
                }
            }
        }
        if rhead.status == 101 {
            if !upgrade || !body_done {
                return Err(Error::BadUpgrade);
            }
            Outcome::Switch
        } else {
            // An HTTP/1.0 client cannot read chunked: strip the framing and close.
            let dechunk = client_http10 && rhead.body == BodyKind::Chunked;
            let client_close = !client_keep_alive
                || rhead.body == BodyKind::CloseDelimited
                || dechunk
                || worker.stopping.get();
            let rrw = ResponseRewrite {
                via: rw.via,
                close: client_close || !body_done,
                keep_alive_10: client_http10 && !client_close,
                upgrade: false,
                dechunk,
            };
            let mut resp_body = if dechunk {
                State::Dechunk(rustle_proto::chunked::Scanner::dechunk())
            } else {
                State::new(rhead.body)
            };
            out.clear();
            write_response(&rhead, ubuf.filled(), &rrw, out);
            ubuf.consume(rhead.len);
            ex.down += body::coalesce(&mut ubuf, &mut resp_body, out, COALESCE, Dir::Down)?;
            ex.status = rhead.status;
            ex.responded = true;
            let resp_fut = async {
                write_timed(&mut cw, out, io).await.map_err(client_side)?;
                body::copy(
                    &mut ur,
                    &mut ubuf,
                    &mut cw,
                    &mut resp_body,
                    Dir::Down,
                    io,
                    splice,
                    limit_down,
                )
                .await
            };
            tokio::pin!(resp_fut);
            // A response may end before the request body does (an early error from the
            // origin): then the rest of the request is not worth waiting for. An answer that
            // takes more than one go is watched for the client leaving (after a tick, and
            // boxed: nothing of it for an answer that goes out at once); a request whose
            // body was streamed is watched already.
            let mut armed = left.is_some() || in_hand;
            let resp_result = loop {
                tokio::select! {
                    biased;
                    r = &mut resp_fut => break r,
                    // Polled once at most: a request body still going, or the client's
                    // read side to hand to the watch.
                    (r, cr, cbuf) = &mut body_fut, if !body_done || !armed => {
                        if !body_done {
                            ex.up += r?;
                            body_done = true;
                        }
                        if !armed {
                            let watch =
                                client_left_http(&worker, cr, cbuf, Phase::UpstreamBody, true);
                            left.set(Some(Box::pin(watch)));
                            armed = true;
                        }
                    }
                    e = poll_some(left.as_mut().as_pin_mut()) => break Err(e),
                }
            };
            ex.down += resp_result?;
            Outcome::Done { body_done, client_close }
        }
    };

    match outcome {
        Outcome::Switch => switch_protocols(c, ex, up, ubuf, rhead, rw.via).await,
        Outcome::Done { body_done, client_close } => {
            let upstream_reusable =
                rhead.keep_alive() && body_done && ubuf.is_empty() && !worker.stopping.get();
            worker.give_buf(ubuf);
            worker.give_fields(std::mem::take(&mut rhead.headers));
            if upstream_reusable {
                // Kept by this client connection for its next request (most go to the
                // same origin); the pool gets it if the next one goes elsewhere.
                c.park_upstream(&key, up, addr);
            } else {
                // A clean end: a TLS origin gets its close_notify.
                up.close_now();
            }
            c.key = key;
            if !body_done || (client_close && !c.buf.is_empty()) {
                // Unread request bytes would make close() send a reset that can destroy
                // the response still in flight: send FIN first. (Buffered bytes on a
                // kept-alive connection are simply the next, pipelined request.)
                let _ = c.stream.shutdown().await;
                Ok(Next::Close)
            } else if client_close {
                Ok(Next::Close)
            } else {
                Ok(Next::KeepAlive)
            }
        }
    }
}

enum Outcome {
    /// 101 Switching Protocols: the connection becomes a relay.
    Switch,
    /// The response was delivered.
    Done { body_done: bool, client_close: bool },
}

/// A 101 to an upgrade request: the rest of the connection is a relay.
async fn switch_protocols(
    c: &mut Client,
    ex: &mut Exchange,
    up: Stream,
    mut ubuf: Buf,
    rhead: ResponseHead,
    via: Option<&str>,
) -> Result<Next, Error> {
    let worker = c.worker.clone();
    c.out.clear();
    let rrw = ResponseRewrite { via, upgrade: true, ..ResponseRewrite::default() };
    write_response(&rhead, ubuf.filled(), &rrw, &mut c.out);
    ubuf.consume(rhead.len);
    let early_down = ubuf.filled().to_vec();
    worker.give_buf(ubuf);
    write_timed(&mut c.stream, &c.out, worker.cfg.timeouts.io).await.map_err(client_side)?;
    ex.status = 101;
    ex.responded = true;
    let early_up = c.buf.filled().to_vec();
    c.buf.clear();
    let throttle = c.throttle();
    Ok(Next::Tunnel(Handoff { upstream: up, early_up, early_down, throttle }))
}

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
    wait: crate::idle::Wait<'a, F>,
    client: Option<Pin<&'a mut W>>,
    /// While the first tick runs: the I/O deadline to move to once it has passed.
    full: Option<std::time::Instant>,
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

/// `client_left` for an HTTP exchange, from now on or (`after_tick`, for an answer that
/// is streaming to the client) once a tick has passed.
async fn client_left_http<R: AsyncRead + Unpin>(
    worker: &Worker,
    r: &mut R,
    buf: &mut Buf,
    phase: Phase,
    after_tick: bool,
) -> Error {
    if after_tick {
        let waiters = &worker.waiters;
        let tick = waiters.deadline(Duration::ZERO);
        let _ = waiters.within(std::future::pending::<()>(), tick).await;
    }
    client_left(r, buf, worker.limits.max_head, phase, false).await
}

/// Waits for `fut` when there is one, forever when not.
async fn poll_some<F: Future>(fut: Option<Pin<&mut F>>) -> F::Output {
    match fut {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Whether a response's whole body came with its head (nothing more to read from the
/// origin): a length that the buffer holds, or no body.
fn answer_in_hand(rhead: &ResponseHead, ubuf: &Buf) -> bool {
    if (100..200).contains(&rhead.status) {
        return false;
    }
    match rhead.body {
        BodyKind::None => true,
        BodyKind::Length(n) => ubuf.len().saturating_sub(rhead.len) as u64 >= n,
        BodyKind::Chunked | BodyKind::CloseDelimited => false,
    }
}

/// Runs `connect` (an upstream connection being made: resolving, connecting, a TLS
/// handshake; boxed by the caller, as its state is large and this is not the pooled path)
/// unless the client leaves first: `left` makes the watch on the client (`client_left`),
/// whose error then ends the attempt at once. As with the origin's answer (`Watched`), the
/// client is looked at only once the attempt has taken a tick (100-200 ms): an attempt
/// that succeeds promptly costs nothing more, and the watch is boxed only for a slow one.
pub(crate) async fn unless_left<T, W>(
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

/// `write_timed` towards the client: failures are the client's.
fn client_side(e: Error) -> Error {
    match e {
        Error::Upstream(io) => Error::Client(io),
        Error::Timeout(_) => Error::Timeout(Phase::ClientWrite),
        other => other,
    }
}
