//! HTTP/2 to clients (RFC 9113), on the `h2` crate's server side: the crate owns framing,
//! HPACK, stream states and flow-control arithmetic; this module decides what each stream
//! is. A connection task drives the `h2` connection and spawns one small task per stream:
//! a proxied request (`forward`: sent to the origin as HTTP/1.1 through the worker's
//! pool), a CONNECT tunnel or an RFC 8441 WebSocket (`tunnel`). Authentication and access
//! rules apply per stream as on HTTP/1.1, and every stream writes one access-log line.
//!
//! Abuse: the crate enforces the stream, header-list, reset-queue and send-buffer limits
//! it is configured with; `io::Watch` counts the frames it answers on its own (PING,
//! SETTINGS, RST_STREAM) frame by frame; a connection over a limit gets GOAWAY
//! ENHANCE_YOUR_CALM, and h2 never sees the frame past the limit nor any after it.
//! Streams that cannot send for `timeouts.io` (a zero window) are reset.

mod forward;
mod io;
mod tunnel;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::error::{ConnectError, Error, Phase};
use crate::front::worker::{ConnGuard, Worker};
use crate::io::buf::Buf;
use crate::io::conn::Stream;
use crate::policy::Listener;
use crate::telemetry::accesslog::{Label, Protocol, Record, Version};
use crate::upstream::{Connected, Tls, Want};

/// How long a connection closing (GOAWAY sent) may take to flush before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// h2c with prior knowledge: HTTP/1.1 read `buf` and found the preface in it. The bytes
/// already read go first, then the socket.
pub(crate) async fn serve_rewound<IO>(
    guard: ConnGuard,
    listener: Arc<Listener>,
    io: IO,
    fd: std::os::fd::RawFd,
    (peer, local): (SocketAddr, Option<std::net::IpAddr>),
    buf: Buf,
) where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let prefix = buf.filled().to_vec();
    guard.worker().give_buf(buf);
    serve_with(guard, listener, (io, fd), (peer, local), None, None, prefix).await
}

/// What the streams of one connection share.
struct Shared {
    guard: RefCell<ConnGuard>,
    worker: Rc<Worker>,
    listener: Arc<Listener>,
    peer: SocketAddr,
    /// The client socket, shut down when the connection's user is cut; -1 once
    /// `serve_with` ended (the socket closes then).
    fd: Cell<std::os::fd::RawFd>,
    /// The local address it came in on, when a route binds to `same`
    /// (`upstream::local_of`).
    local: Option<std::net::IpAddr>,
    /// The user this connection authenticated as, once one did.
    auth: RefCell<Option<Authenticated>>,
    /// The user a verified client certificate names: no password is asked.
    cert_user: Option<Rc<str>>,
    /// The connection's user's traffic counters, found at its first stream (a connection
    /// cannot change users).
    traffic: RefCell<Option<Arc<crate::limits::UserTraffic>>>,
    /// The TLS session under the connection (ALPN h2), for log lines.
    tls: Option<Rc<crate::io::tls::Session>>,
    /// Stream tasks alive (tunnels included), for closing idle connections.
    streams: Cell<usize>,
    /// The connection task, woken when the last stream ends so that its idle timer
    /// starts then rather than at its next event.
    driver: Cell<Option<std::task::Waker>>,
    /// Origin connections bound to this client (connection-based authentication,
    /// `exchange::Pinned`): its streams' alone, never pooled, closed with it.
    pins: RefCell<crate::front::exchange::Pins>,
}

impl Shared {
    /// The traffic counters of the stream's user, if any (a tunnel's relay counts into
    /// them as bytes move).
    fn traffic_of(&self, user: Option<&str>) -> Option<Arc<crate::limits::UserTraffic>> {
        user.map(|u| self.traffic(u))
    }

    /// The traffic counters of the connection's user.
    fn traffic(&self, user: &str) -> Arc<crate::limits::UserTraffic> {
        self.traffic.borrow_mut().get_or_insert_with(|| self.worker.traffic.entry(user)).clone()
    }

    /// Why a stream of `user` is refused, when one of its quotas is used up: one relaxed
    /// load once its counters are found.
    fn over_quota(&self, user: &str) -> Option<Error> {
        let mut traffic = self.traffic.borrow_mut();
        traffic.get_or_insert_with(|| self.worker.traffic.entry(user)).over_quota()
    }

    /// The bandwidth limits of one stream: its listener's and its user's, as for an
    /// HTTP/1.1 connection.
    fn throttle(&self, user: Option<&str>) -> crate::limits::Throttle {
        self.worker.throttle(&self.listener.throttle, user)
    }
}

/// A connection's user, with the header value that proved it and the users' generation
/// it was checked against (a later stream with the same value needs no new check).
struct Authenticated {
    user: Rc<str>,
    params: Option<Rc<crate::acl::Params>>,
    seen: Vec<u8>,
    generation: u64,
}

/// Counts a stream task as alive while it exists.
struct Live(Rc<Shared>);

impl Live {
    fn new(shared: &Rc<Shared>) -> Live {
        shared.streams.set(shared.streams.get() + 1);
        Live(shared.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let left = self.0.streams.get() - 1;
        self.0.streams.set(left);
        if left == 0 {
            if let Some(w) = self.0.driver.take() {
                w.wake();
            }
        }
    }
}

/// HTTP/2 inside TLS (ALPN `h2`): `tls` is logged with every stream; `cert_user` is the
/// user a verified client certificate names.
pub(crate) async fn serve_tls<IO>(
    guard: ConnGuard,
    listener: Arc<Listener>,
    io: IO,
    fd: std::os::fd::RawFd,
    (peer, local): (SocketAddr, Option<std::net::IpAddr>),
    tls: Rc<crate::io::tls::Session>,
    cert_user: Option<String>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
{
    serve_with(guard, listener, (io, fd), (peer, local), Some(tls), cert_user, Vec::new()).await
}

async fn serve_with<IO>(
    mut guard: ConnGuard,
    listener: Arc<Listener>,
    (io, fd): (IO, std::os::fd::RawFd),
    (peer, local): (SocketAddr, Option<std::net::IpAddr>),
    tls: Option<Rc<crate::io::tls::Session>>,
    cert_user: Option<String>,
    prefix: Vec<u8>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let worker = guard.worker().clone();
    let start = Instant::now();
    // The one line of a connection refused or ended for cause before or besides its
    // streams' own lines.
    let conn_tls = tls.clone();
    let refused = |listener: &Listener, why: &dyn std::fmt::Display, user: Option<&str>| {
        let mut r = Record::new(peer, listener, &listener.counters, Protocol::Http, start);
        (r.version, r.user, r.tls, r.error) =
            (Version::Http2, user, conn_tls.as_deref(), Some(why));
        crate::front::exchange::end(&worker, None, r, None);
    };
    if let Some(user) = &cert_user {
        if let Err(e) = guard.hold_user(user, peer.ip(), fd) {
            tracing::warn!("{peer}: HTTP/2 connection refused: {e}");
            refused(&listener, &e, Some(user));
            return;
        }
    }
    let cfg = &worker.cfg().http2;
    let flood = Rc::new(io::Flood::new(cfg));
    let out = io::Out::new(io);
    let io = io::Watch::new(out.clone(), flood.clone(), prefix);
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(cfg.max_concurrent_streams)
        .max_header_list_size(cfg.max_header_list_size)
        .initial_window_size(cfg.initial_stream_window)
        .initial_connection_window_size(cfg.initial_connection_window)
        .max_send_buffer_size(cfg.max_send_buffer_size)
        .max_pending_accept_reset_streams(cfg.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(Some(cfg.max_local_error_reset_streams))
        .enable_connect_protocol();
    let handshake = builder.handshake::<_, Bytes>(io);
    let mut conn = match tokio::time::timeout(worker.cfg().timeouts.header, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!("{peer}: HTTP/2 handshake failed: {e}");
            refused(&listener, &format_args!("HTTP/2 handshake failed: {e}"), None);
            return;
        }
        Err(_) => {
            tracing::debug!("{peer}: HTTP/2 handshake timed out");
            refused(&listener, &"HTTP/2 handshake timed out", None);
            return;
        }
    };
    // From here on the connection task sends h2's writes, once per poll (see `io`).
    out.borrow_mut().gather();
    let shared = Rc::new(Shared {
        guard: RefCell::new(guard),
        worker: worker.clone(),
        listener,
        peer,
        fd: Cell::new(fd),
        local,
        auth: RefCell::new(None),
        cert_user: cert_user.map(Rc::from),
        traffic: RefCell::new(None),
        tls,
        streams: Cell::new(0),
        driver: Cell::new(None),
        pins: RefCell::default(),
    });
    // Dropped before `conn` and `out` (declared after them), so before the socket closes.
    let _ending = Ending(&shared);
    let mut shutdown = worker.shutdown.clone();
    let keepalive = worker.cfg().timeouts.keepalive;
    // Armed while no stream is open: an idle connection is closed like an idle HTTP/1.1
    // one. Once closing, the same timer bounds how long the GOAWAY may take.
    let mut timer: Pin<Box<tokio::time::Sleep>> = Box::pin(tokio::time::sleep(keepalive));
    let mut idle_armed = false;
    let mut closing = false;
    let mut flooded = false;
    loop {
        // A new stream is the large variant; the value lives only until it is matched.
        #[allow(clippy::large_enum_variant)]
        enum Event {
            Stream(Request<RecvStream>, SendResponse<Bytes>),
            Closed,
            Failed(h2::Error),
            Flood(&'static str),
            WriteFailed(std::io::Error),
            Shutdown,
            Idle,
        }
        let event = {
            let changed = shutdown.changed();
            tokio::pin!(changed);
            std::future::poll_fn(|cx| {
                let r = conn.poll_accept(cx);
                // What that poll wrote, in one go; if the socket is full, its readiness
                // wakes this task, which polls the connection again and sends the rest.
                if let Poll::Ready(Err(e)) = out.borrow_mut().poll_send(cx) {
                    return Poll::Ready(Event::WriteFailed(e));
                }
                // The frames that tripped a limit were read during that poll.
                if let (Some(why), false) = (flood.tripped(), flooded) {
                    return Poll::Ready(Event::Flood(why));
                }
                match r {
                    Poll::Ready(Some(Ok((req, respond)))) => {
                        return Poll::Ready(Event::Stream(req, respond))
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Event::Failed(e)),
                    Poll::Ready(None) => return Poll::Ready(Event::Closed),
                    Poll::Pending => {}
                }
                if !closing && changed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Shutdown);
                }
                let idle = shared.streams.get() == 0;
                if !idle {
                    let w = match shared.driver.take() {
                        Some(w) if w.will_wake(cx.waker()) => w,
                        _ => cx.waker().clone(),
                    };
                    shared.driver.set(Some(w));
                }
                if idle && !idle_armed && !closing {
                    timer.as_mut().reset(tokio::time::Instant::now() + keepalive);
                }
                idle_armed = idle;
                if (idle || closing) && timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Idle);
                }
                Poll::Pending
            })
            .await
        };
        match event {
            Event::Stream(req, respond) => {
                idle_armed = false;
                let live = Live::new(&shared);
                tokio::task::spawn_local(stream(live, req, respond));
            }
            Event::Closed => break,
            Event::WriteFailed(e) => {
                tracing::debug!("{peer}: HTTP/2 connection lost: {e}");
                break;
            }
            Event::Failed(e) => {
                log_failure(peer, &e);
                // A protocol error of the client's that h2 answered with GOAWAY (not a
                // broken socket, not the client's own GOAWAY), unless the flood said it.
                if !e.is_io() && !e.is_remote() && !flooded {
                    let why = format_args!("HTTP/2 connection error: {e}");
                    refused(&shared.listener, &why, shared.cert_user.as_deref());
                }
                break;
            }
            Event::Flood(why) => {
                flooded = true;
                let why = format_args!("HTTP/2 connection closed for abuse: {why}");
                refused(&shared.listener, &why, shared.cert_user.as_deref());
                tracing::warn!(
                    "{peer}: HTTP/2 connection closed for abuse ({why}); GOAWAY ENHANCE_YOUR_CALM"
                );
                conn.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                closing = true;
                timer.as_mut().reset(tokio::time::Instant::now() + CLOSE_GRACE);
            }
            Event::Shutdown => {
                conn.graceful_shutdown();
                closing = true;
                let grace = worker.cfg().timeouts.shutdown;
                timer.as_mut().reset(tokio::time::Instant::now() + grace);
            }
            Event::Idle if closing => {
                tracing::debug!("{peer}: HTTP/2 connection did not close in time; dropping it");
                // Its grace is used up: nothing more is waited for (its end is still
                // said: close_notify on TLS, if the socket takes it).
                out.borrow_mut().shutdown_now();
                return;
            }
            Event::Idle => {
                conn.graceful_shutdown();
                closing = true;
                timer.as_mut().reset(tokio::time::Instant::now() + CLOSE_GRACE);
            }
        }
    }
    // What the last poll gathered (a GOAWAY after an error), given a moment to go out.
    let send = std::future::poll_fn(|cx| out.borrow_mut().poll_send(cx));
    let _ = tokio::time::timeout(CLOSE_GRACE, send).await;
}

/// Ends a connection's hold on its socket descriptor when `serve_with` returns, before
/// the socket closes: the stream tasks keep `Shared` (and its guard) alive after it.
struct Ending<'a>(&'a Shared);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        self.0.fd.set(-1);
        self.0.guard.borrow_mut().release_cut();
    }
}

/// A connection that ended with an error: abuse the h2 crate detected is worth a warning,
/// other protocol errors and broken sockets are the client's business.
fn log_failure(peer: SocketAddr, e: &h2::Error) {
    if e.reason() == Some(Reason::ENHANCE_YOUR_CALM) && !e.is_remote() {
        tracing::warn!(
            "{peer}: HTTP/2 connection closed for abuse ({e}); GOAWAY ENHANCE_YOUR_CALM"
        );
    } else {
        tracing::debug!("{peer}: HTTP/2 connection ended: {e}");
    }
}

/// What one stream's log line says, filled in as it goes.
struct Exchange {
    start: Instant,
    /// The method and target (and User-Agent and Referer when the log shows them), made
    /// only when there is a log; its protocol (a request or a CONNECT) either way.
    label: Label,
    status: u16,
    up: u64,
    down: u64,
    upstream: Option<SocketAddr>,
    /// The route and parents taken, if any.
    via: Option<Rc<crate::telemetry::accesslog::Via>>,
    user: Option<Rc<str>>,
    /// The parameters of the stream's user name (`[auth.params]`).
    params: Option<Rc<crate::acl::Params>>,
    /// The stream became a tunnel (CONNECT, WebSocket), for the metrics' durations.
    tunnel: bool,
}

impl Exchange {
    /// Moves the record out (to a tunnel task, which logs it when it ends).
    fn take(&mut self) -> Exchange {
        Exchange {
            start: self.start,
            label: {
                let (protocol, version) = (self.label.protocol, self.label.version);
                let mut label = std::mem::replace(&mut self.label, Label::new([b""; 4]));
                (label.protocol, label.version) = (protocol, version);
                label
            },
            status: self.status,
            up: self.up,
            down: self.down,
            upstream: self.upstream,
            via: self.via.take(),
            user: self.user.clone(),
            params: self.params.clone(),
            tunnel: true,
        }
    }

    /// The stream's end (`exchange::end`): the user's traffic, the metrics, the log line.
    fn log(&self, shared: &Shared, error: Option<&Error>) {
        self.log_counted(shared, error, (0, 0));
    }

    /// `log`, where `counted` of `up` and `down` were added to the user's counters as
    /// they moved (a tunnel's relay).
    fn log_counted(&self, shared: &Shared, error: Option<&Error>, counted: (u64, u64)) {
        let mut record = Record::new(
            shared.peer,
            &shared.listener,
            &shared.listener.counters,
            Protocol::Http,
            self.start,
        );
        record.label(&self.label);
        record.user = self.user.as_deref();
        (record.status, record.up, record.down) = (self.status, self.up, self.down);
        (record.upstream, record.via) = (self.upstream, self.via.as_deref());
        (record.tunnel, record.tls) = (self.tunnel, shared.tls.as_deref());
        record.counted = counted;
        let traffic = shared.traffic.borrow();
        crate::front::exchange::end(&shared.worker, traffic.as_deref(), record, error);
    }
}

/// The task of one stream until its answer (a tunnel continues in a task of its own).
async fn stream(live: Live, req: Request<RecvStream>, mut respond: SendResponse<Bytes>) {
    let shared = live.0.clone();
    crate::telemetry::metrics::h2_stream(&shared.listener.counters);
    // The log line's method and target, formatted only when there is a log.
    let header = |name: http::header::HeaderName| match shared.worker.log.wants_headers() {
        true => req.headers().get(name).map(|v| v.as_bytes()).unwrap_or_default(),
        false => &[],
    };
    let mut label = match shared.worker.log.enabled() {
        true => Label::new([
            req.method().as_str().as_bytes(),
            target_text(&req).as_bytes(),
            header(http::header::USER_AGENT),
            header(http::header::REFERER),
        ]),
        false => Label::new([b""; 4]),
    };
    let connect = req.method() == http::Method::CONNECT
        && req.extensions().get::<h2::ext::Protocol>().is_none();
    label.protocol = if connect { Protocol::Connect } else { Protocol::Http };
    label.version = Version::Http2;
    let mut ex = Exchange {
        label,
        start: Instant::now(),
        status: 0,
        up: 0,
        down: 0,
        upstream: None,
        via: None,
        user: None,
        params: None,
        tunnel: false,
    };
    let mut slot = None;
    let result = async {
        let slot = &mut slot;
        if shared.listener.auth {
            (ex.user, ex.params) = authenticate(&shared, req.headers()).await?;
        } else {
            ex.user = shared.cert_user.clone();
        }
        // A user over quota: one relaxed load per stream.
        if let Some(e) = ex.user.as_deref().and_then(|u| shared.over_quota(u)) {
            return Err(e);
        }
        // Every kind of stream below may open an upstream connection: it counts against
        // the connection limits until it ends (a tunnel: until its relay ends).
        *slot = Some(
            shared
                .worker
                .admit_stream(shared.peer.ip(), ex.user.as_deref())
                .inspect_err(|e| tracing::warn!("{}: HTTP/2 stream refused: {e}", shared.peer))?,
        );
        let protocol = req.extensions().get::<h2::ext::Protocol>().map(|p| p.as_str().to_owned());
        match (req.method() == http::Method::CONNECT, protocol.as_deref()) {
            (true, None) => tunnel::connect(&shared, &mut ex, req, &mut respond, live).await,
            (true, Some("websocket")) => {
                let r = forward::websocket(&shared, &mut ex, req, &mut respond, live).await;
                r.map_err(|e| {
                    e.through(ex.via.as_deref().map(crate::telemetry::accesslog::Via::last_parent))
                })
            }
            (true, Some(_)) => Err(Error::Unsupported(
                "extended CONNECT: the only :protocol supported is websocket",
            )),
            (false, _) => {
                let r = forward::forward(&shared, &mut ex, req, &mut respond).await;
                r.map(|()| None).map_err(|e| {
                    e.through(ex.via.as_deref().map(crate::telemetry::accesslog::Via::last_parent))
                })
            }
        }
    }
    .await;
    match result {
        // The tunnel task logs when it ends.
        Ok(Some(tunnel)) => {
            tokio::task::spawn_local(async move {
                tunnel.await;
                drop(slot);
            });
        }
        Ok(None) => ex.log(&shared, None),
        Err(e) => {
            if ex.status == 0 {
                ex.status = answer_error(&shared, &mut respond, &e);
            }
            ex.log(&shared, Some(&e));
        }
    }
}

/// The target as the access log shows it: `host:port` for CONNECT, the URL otherwise.
fn target_text<B>(req: &Request<B>) -> String {
    let uri = req.uri();
    if req.method() == http::Method::CONNECT
        && req.extensions().get::<h2::ext::Protocol>().is_none()
    {
        uri.authority().map(|a| a.as_str().to_string()).unwrap_or_else(|| "-".into())
    } else {
        uri.to_string()
    }
}

/// Answers an error on a stream that has no response yet; returns the status sent (0
/// when the stream was reset instead).
fn answer_error(shared: &Shared, respond: &mut SendResponse<Bytes>, e: &Error) -> u16 {
    let Some(status) = e.status() else {
        respond.send_reset(Reason::CANCEL);
        return 0;
    };
    let mut resp = Response::new(());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let h = resp.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if status == 407 {
        let policy = shared.worker.policy();
        if policy.negotiate.is_some() {
            h.append(http::header::PROXY_AUTHENTICATE, HeaderValue::from_static("Negotiate"));
        }
        let realm = policy.realm.replace(['"', '\\'], "");
        if let Ok(v) = HeaderValue::from_str(&format!("Basic realm=\"{realm}\"")) {
            h.append(http::header::PROXY_AUTHENTICATE, v);
        }
    }
    let body = Bytes::from(format!("{e}\n"));
    h.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    match respond.send_response(resp, false) {
        // Small: fits any window the client may have left, or waits in h2's buffer.
        Ok(mut send) => {
            let _ = send.send_data(body, true);
        }
        Err(_) => return 0,
    }
    status
}

/// `proxy-authorization` of one stream, checked once per connection while it stays the
/// same (as on HTTP/1.1). A connection counts against its first user's limit.
async fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
) -> Result<(Option<Rc<str>>, Option<Rc<crate::acl::Params>>), Error> {
    if let Some(user) = &shared.cert_user {
        return Ok((Some(user.clone()), None));
    }
    let Some(value) = headers.get(http::header::PROXY_AUTHORIZATION) else {
        return Err(Error::AuthRequired("credentials required"));
    };
    let value = value.as_bytes();
    let generation = shared.worker.users_generation();
    if let Some(a) = &*shared.auth.borrow() {
        if a.seen.as_slice() == value && a.generation == generation {
            return Ok((Some(a.user.clone()), a.params.clone()));
        }
    }
    let mut scratch = Vec::new();
    let negotiated;
    let (user, params) = match crate::policy::auth::parse_basic(value, &mut scratch) {
        Ok((user, password)) => {
            let l = &shared.listener;
            let origin = crate::policy::auth::Origin {
                listener: l.name.as_deref(),
                addr: l.listen,
                protocol: "http2",
            };
            shared.worker.authenticate(origin, shared.peer.ip(), user, password).await?
        }
        // Not Basic: Negotiate, where `[auth.kerberos]` accepts it.
        Err(_) => {
            negotiated = shared.worker.negotiate(shared.peer.ip(), value)?;
            (negotiated.as_str(), None)
        }
    };
    let current = shared.auth.borrow().as_ref().map(|a| a.user.clone());
    if current.as_deref().is_some_and(|u| u != user) {
        return Err(Error::AuthRequired("a connection cannot change users"));
    }
    // The connection's socket closed (`Ending`): no stream may hold a descriptor number
    // the kernel may have given to another connection.
    let fd = shared.fd.get();
    if fd < 0 {
        return Err(Error::Client(std::io::ErrorKind::NotConnected.into()));
    }
    shared.guard.borrow_mut().hold_user(user, shared.peer.ip(), fd)?;
    let user: Rc<str> = current.unwrap_or_else(|| Rc::from(user));
    let params = params.map(Rc::new);
    *shared.auth.borrow_mut() = Some(Authenticated {
        user: user.clone(),
        params: params.clone(),
        seen: value.to_vec(),
        generation,
    });
    Ok((Some(user), params))
}

/// A stream's user and the parameters of its user name.
type Who<'a> = (Option<&'a str>, Option<&'a crate::acl::Params>);

/// A connection for this stream from the upstream layer (`upstream::Upstreams`): a pooled
/// one under `key` when there is one, or a new one (boxed: an attempt's state would
/// otherwise enlarge every stream's future). Callers race it against the stream's reset
/// (`unless_reset`).
async fn upstream(
    shared: &Shared,
    (user, params): Who<'_>,
    key: Option<&[u8]>,
    host: &str,
    port: u16,
    protocol: crate::acl::Protocol,
    tls: Tls<'_>,
) -> Result<Connected, Error> {
    let worker = &shared.worker;
    let policy = worker.policy();
    let want = Want {
        host,
        port,
        protocol,
        client: shared.peer.ip(),
        addrs: (&shared.peer, &shared.listener.listen),
        user,
        listener: shared.listener.name.as_deref(),
        tls,
        local: shared.local,
        params,
        seed: None,
    };
    if let Some(key) = key {
        let pinned = shared.pins.borrow_mut().take(key, &policy, &want)?;
        if let Some(c) = pinned {
            return Ok(c);
        }
    }
    // The stream's reset is watched by the caller (`unless_reset`).
    let key = key.map(|k| worker.upstreams.key(k));
    crate::front::exchange::connect(worker, &policy, &want, key, std::future::pending).await
}

/// A new plain connection for a tunnel (CONNECT or WebSocket stream), and what came
/// with it.
struct Tcp {
    stream: TcpStream,
    addr: SocketAddr,
    via: Option<Rc<crate::telemetry::accesslog::Via>>,
    absolute: Option<Option<Box<[u8]>>>,
    early: Vec<u8>,
}

/// A new plain connection for a tunnel (CONNECT or WebSocket stream). A tunnel on an
/// HTTP/2 stream relays from the socket itself: one through a TLS parent is refused.
async fn upstream_tcp(
    shared: &Shared,
    who: Who<'_>,
    host: &str,
    port: u16,
    protocol: crate::acl::Protocol,
) -> Result<Tcp, Error> {
    let c = upstream(shared, who, None, host, port, protocol, Tls::Plain).await?;
    match c.stream {
        Stream::Tcp(stream) => {
            Ok(Tcp { stream, addr: c.addr, via: c.via, absolute: c.absolute, early: c.early })
        }
        _ => Err(Error::Connect(ConnectError::Tls {
            addr: c.addr,
            reason: "a tunnel on an HTTP/2 stream needs a plain connection (not through an \
                     https parent)"
                .into(),
        })),
    }
}

/// The authority a proxied request names: its `:authority`, which a proxied request must
/// carry (RFC 9113 8.3.1: clients generating HTTP/2 requests use it, not Host). A Host
/// field alone cannot stand in, as the h2 crate then drops `:scheme` and an `https`
/// request could not be told from an `http` one. A Host field that names another host
/// than the `:authority` makes the request malformed.
fn authority(parts: &http::request::Parts) -> Result<http::uri::Authority, Error> {
    let a = parts.uri.authority().ok_or(Error::Unsupported("the request has no :authority"))?;
    let Some(host) = parts.headers.get(http::header::HOST) else { return Ok(a.clone()) };
    // Compared as RFC 9113 8.3.1 asks, after normalising: host names case-insensitively,
    // a missing or empty port as the scheme's default.
    let default = if parts.uri.scheme_str() == Some("https") { 443 } else { 80 };
    let normal = |s: &[u8]| -> Option<(String, u16)> {
        let s = std::str::from_utf8(s).ok()?;
        let s = s.strip_suffix(':').unwrap_or(s);
        let a = s.parse::<http::uri::Authority>().ok()?;
        Some((a.host().to_ascii_lowercase(), a.port_u16().unwrap_or(default)))
    };
    match (normal(a.as_str().as_bytes()), normal(host.as_bytes())) {
        (Some(x), Some(y)) if x == y => Ok(a.clone()),
        _ => Err(Error::Unsupported("host differs from :authority")),
    }
}

/// `host` and `port` of an authority; `default_port` when it has none (None: required).
/// The host is lower-cased (borrowed when it already is).
fn host_port(
    authority: Option<&http::uri::Authority>,
    default_port: Option<u16>,
) -> Result<(std::borrow::Cow<'_, str>, u16), Error> {
    let a = authority.ok_or(Error::Unsupported("the request has no :authority"))?;
    if a.as_str().contains('@') {
        return Err(Error::Unsupported("user information in :authority is not allowed"));
    }
    let port = match (a.port_u16(), default_port) {
        (Some(0), _) => return Err(Error::Unsupported("port 0 is not a destination")),
        (Some(p), _) | (None, Some(p)) => p,
        (None, None) => return Err(Error::Unsupported("CONNECT needs host:port in :authority")),
    };
    let host = a.host();
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        return Err(Error::Unsupported("the :authority has no host"));
    }
    let host = match host.bytes().any(|b| b.is_ascii_uppercase()) {
        true => std::borrow::Cow::Owned(host.to_ascii_lowercase()),
        false => std::borrow::Cow::Borrowed(host),
    };
    Ok((host, port))
}

/// Sends `data` on a stream as the client's window allows; a window that stays shut for
/// `stall` is a client that does not read.
async fn send_all(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
    end: bool,
    stall: Duration,
) -> Result<(), Error> {
    loop {
        if data.is_empty() {
            if end {
                send.send_data(data, true).map_err(client_error)?;
            }
            return Ok(());
        }
        send.reserve_capacity(data.len());
        let mut cap = send.capacity();
        if cap == 0 {
            cap = match crate::io::body::timed(
                std::future::poll_fn(|cx| send.poll_capacity(cx)),
                stall,
            )
            .await
            {
                None => return Err(Error::Timeout(Phase::ClientWrite)),
                Some(None) => return Err(client_gone()),
                Some(Some(r)) => r.map_err(client_error)?,
            };
        }
        let piece = data.split_to(cap.min(data.len()));
        let last = end && data.is_empty();
        send.send_data(piece, last).map_err(client_error)?;
        if last {
            return Ok(());
        }
    }
}

fn client_error(e: h2::Error) -> Error {
    Error::Client(std::io::Error::other(e))
}

fn client_gone() -> Error {
    Error::Client(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "stream closed"))
}

/// A 1-in-2^64 nonce source without a random-number dependency: the standard library's
/// per-process random hash keys over a counter and the clock.
fn nonce() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static KEYS: (std::collections::hash_map::RandomState, Cell<u64>) = Default::default();
    }
    KEYS.with(|(keys, n)| {
        n.set(n.get() + 1);
        let mut out = [0u8; 16];
        for (i, half) in out.chunks_mut(8).enumerate() {
            let mut h = keys.build_hasher();
            h.write_u64(n.get());
            h.write_usize(i);
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            h.write_u128(now.map_or(0, |d| d.as_nanos()));
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
        out
    })
}

/// Ends when the client resets the stream or its connection ends, for a wait on the
/// origin before the response is sent (`SendResponse::poll_reset`, which may be asked
/// only until then).
pub(crate) struct Reset<'a>(pub(crate) &'a mut SendResponse<Bytes>);

impl std::future::Future for Reset<'_> {
    type Output = Error;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Error> {
        self.0.poll_reset(cx).map(|_| Error::ClientLeft(Phase::UpstreamHead))
    }
}

/// Runs `fut` (a connection to the origin being made) unless the client resets the stream
/// or leaves first. A pooled connection comes at once, and the stream is not looked at.
pub(crate) async fn unless_reset<T>(
    respond: &mut SendResponse<Bytes>,
    fut: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let mut fut = std::pin::pin!(fut);
    let mut reset = Reset(respond);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        std::task::Poll::Ready(r) => std::task::Poll::Ready(r),
        std::task::Poll::Pending => std::pin::Pin::new(&mut reset).poll(cx).map(|e| {
            Err(match e {
                Error::ClientLeft(_) => Error::ClientLeft(Phase::Connect),
                other => other,
            })
        }),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        let a = |s: &str| s.parse::<http::uri::Authority>().expect("auth");
        assert_eq!(
            host_port(Some(&a("Example.COM:8080")), None).ok(),
            Some(("example.com".into(), 8080))
        );
        assert_eq!(host_port(Some(&a("[::1]:443")), None).ok(), Some(("::1".into(), 443)));
        assert_eq!(
            host_port(Some(&a("example.com")), Some(80)).ok(),
            Some(("example.com".into(), 80))
        );
        assert!(host_port(Some(&a("example.com")), None).is_err());
        assert!(host_port(Some(&a("u:p@example.com:80")), None).is_err());
        assert!(host_port(Some(&a("example.com:0")), None).is_err());
        assert!(host_port(None, Some(80)).is_err());
    }

    #[test]
    fn authority_or_host() {
        let parts = |uri: &str, host: Option<&str>| {
            let mut b = Request::builder().uri(uri);
            if let Some(h) = host {
                b = b.header("host", h);
            }
            b.body(()).expect("request").into_parts().0
        };
        let got = |p| authority(&p).map(|a| a.to_string()).map_err(|e| e.to_string());
        assert_eq!(got(parts("http://a.example:81/", None)), Ok("a.example:81".into()));
        assert!(got(parts("/x", Some("b.example"))).is_err());
        assert_eq!(got(parts("http://A.example/", Some("a.EXAMPLE"))), Ok("A.example".into()));
        assert!(got(parts("http://a.example/", Some("c.example"))).is_err());
        assert!(got(parts("http://a.example/", Some("a.example:80"))).is_ok());
        assert!(got(parts("http://a.example:80/", Some("a.example:"))).is_ok());
        assert!(got(parts("https://a.example/", Some("a.example:443"))).is_ok());
        assert!(got(parts("https://a.example/", Some("a.example:80"))).is_err());
        assert!(got(parts("http://a.example:81/", Some("a.example"))).is_err());
        assert!(got(parts("/x", None)).is_err());
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
