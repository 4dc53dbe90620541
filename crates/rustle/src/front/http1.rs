//! The HTTP/1.1 side facing clients: reads request heads, answers what the proxy answers
//! itself (errors, Max-Forwards 0), and hands absolute-form requests to `forward` and
//! CONNECT requests to `connect`. A connection serves requests in order until either side
//! asks to close, an error occurs, or the worker shuts down.

use std::io::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustle_proto::http::{parse_request, Method, RequestHead, Target};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

mod connect;
mod forward;

use crate::error::{Error, Phase};
use crate::front::tunnel::Handoff;
use crate::front::worker::{ConnGuard, Worker};
use crate::io::buf::Buf;
use crate::io::conn::Stream;
use crate::policy::Listener;
use crate::telemetry::accesslog::{Label, Protocol, Record, Version};
use crate::upstream::{Connected, Tls, Want};

/// How long an error response, or the TLS close_notify that ends a connection, may take
/// to reach a client before it is abandoned.
const ERROR_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection that opened with the HTTP/2 preface (h2c with prior knowledge), handed
/// on to go on as HTTP/2, its bytes read so far in `buf`.
pub(crate) struct H2c {
    pub(crate) guard: ConnGuard,
    pub(crate) listener: Arc<Listener>,
    pub(crate) stream: Stream,
    pub(crate) peer: SocketAddr,
    pub(crate) buf: Buf,
}

/// What happens to a client connection after an exchange.
pub(crate) enum Next {
    KeepAlive,
    Close,
    /// The connection became a tunnel (CONNECT, or an upgrade answered 101).
    Tunnel(Handoff),
}

/// One client connection.
pub(crate) struct Client {
    pub(crate) guard: ConnGuard,
    pub(crate) worker: Rc<Worker>,
    pub(crate) listener: Arc<Listener>,
    pub(crate) stream: Stream,
    pub(crate) peer: SocketAddr,
    pub(crate) buf: Buf,
    pub(crate) head: RequestHead,
    /// Outgoing heads are assembled here (from the worker's spares; given back while the
    /// connection waits for a request).
    pub(crate) out: Vec<u8>,
    /// The current request's pool key (`host:port`), reused across requests.
    pub(crate) key: forward::PoolKey,
    /// Origin connections bound to this client (connection-based authentication,
    /// `exchange::Pinned`): never pooled, closed with it.
    pub(crate) pins: crate::front::exchange::Pins,
    /// The user this connection authenticated as, and the header value that proved it
    /// (a later request with the same value needs no new check).
    pub(crate) user: Option<Rc<str>>,
    /// The parameters its user name carried (`[auth.params]`), with the same header value.
    pub(crate) params: Option<Rc<crate::acl::Params>>,
    auth_seen: Vec<u8>,
    /// The users' generation `auth_seen` was checked against (a reload invalidates it).
    auth_gen: u64,
    /// The user's traffic counters, found once per connection.
    traffic: Option<Arc<crate::limits::UserTraffic>>,
    /// What the current request's log line shows of it.
    logged: Label<Vec<u8>>,
    /// The TLS session of an HTTPS proxy port, for log lines.
    pub(crate) tls: Option<Rc<crate::io::tls::Session>>,
    /// The user came from a verified client certificate: no password is asked.
    cert_auth: bool,
}

/// What the log line of one exchange says, filled in as it goes.
pub(crate) struct Exchange {
    pub(crate) start: Instant,
    pub(crate) status: u16,
    /// Body bytes up and down (`body::Tally`): on the user's counters as they move,
    /// when the connection has a user.
    pub(crate) moved: [std::cell::Cell<u64>; 2],
    pub(crate) upstream: Option<SocketAddr>,
    /// The route and parents taken, if any.
    pub(crate) via: Option<Rc<crate::telemetry::accesslog::Via>>,
    /// A status line has gone to the client: an error can no longer be answered.
    pub(crate) responded: bool,
    /// The body going to the client ends with the connection (close-delimited): cut
    /// short, the connection is reset rather than closed, or the cut would look whole.
    pub(crate) unframed: bool,
}

impl Exchange {
    fn new(start: Instant) -> Self {
        Exchange {
            start,
            status: 0,
            moved: Default::default(),
            upstream: None,
            via: None,
            responded: false,
            unframed: false,
        }
    }
}

/// Serves a connection whose first bytes may already be in `buf` (after detection). One
/// that opens with the HTTP/2 preface (h2c with prior knowledge) is given to `h2c`.
pub(crate) fn serve_buffered(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: Stream,
    peer: SocketAddr,
    buf: Buf,
    h2c: impl FnOnce(H2c),
) -> impl std::future::Future<Output = ()> {
    serve_with(guard, listener, stream, peer, buf, None, None, h2c)
}

/// Serves HTTP inside TLS: `user` is the one a verified client certificate names.
pub(crate) async fn serve_tls(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: Stream,
    peer: SocketAddr,
    tls: Rc<crate::io::tls::Session>,
    user: Option<String>,
) {
    let buf = guard.worker().take_buf();
    // ALPN chose HTTP/1.1: no preface to switch on.
    serve_with(guard, listener, stream, peer, buf, Some(tls), user, |_| {}).await;
}

// The h2c hand-off is a type parameter, so that it takes no room in the future: one
// argument more than clippy likes.
#[allow(clippy::too_many_arguments)]
async fn serve_with(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: Stream,
    peer: SocketAddr,
    buf: Buf,
    tls: Option<Rc<crate::io::tls::Session>>,
    cert_user: Option<String>,
    h2c: impl FnOnce(H2c),
) {
    let worker = guard.worker().clone();
    let mut c = Client {
        guard,
        worker: worker.clone(),
        listener,
        stream,
        peer,
        buf,
        user: None,
        params: None,
        auth_seen: Vec::new(),
        auth_gen: 0,
        traffic: None,
        head: RequestHead::new(),
        out: Vec::new(),
        key: forward::PoolKey::default(),
        pins: Default::default(),
        logged: Label::default(),
        tls,
        cert_auth: false,
    };
    if let Some(user) = cert_user {
        // The client's address from `c`: a copy of `peer` kept here would enlarge every
        // connection's future.
        let fd = c.stream.raw_fd();
        if let Err(e) = c.guard.hold_user(&user, c.peer.ip(), fd) {
            let mut ex = Exchange::new(Instant::now());
            c.fail(&mut ex, &e).await;
            return;
        }
        c.traffic = Some(c.guard.user_entry().unwrap_or_else(|| worker.traffic.entry(&user)));
        c.user = Some(Rc::from(user));
        c.cert_auth = true;
    }
    // Whether the connection ends without an error (which `fail` has dealt with).
    let mut clean = true;
    loop {
        let start = worker.stamp();
        match c.read_head().await {
            Ok(true) => {}
            Ok(false) => break,
            // h2c with prior knowledge: the connection opened with the HTTP/2 preface,
            // and goes on as HTTP/2 (`dispatch`).
            Err(_) if c.listener.h2c && rustle_proto::detect::is_h2_preface(c.buf.filled()) => {
                let Client { guard, listener, stream, peer, buf, .. } = c;
                h2c(H2c { guard, listener, stream, peer, buf });
                return;
            }
            Err(e) => {
                c.keep_request_line();
                let mut ex = Exchange::new(start);
                c.fail(&mut ex, &e).await;
                clean = false;
                break;
            }
        }
        let mut ex = Exchange::new(worker.stamp());
        // Kept for the record (the head is consumed by then).
        c.keep_for_log();
        let next = match c.handle(&mut ex).await {
            Ok(Next::Tunnel(handoff)) => {
                // The tunnel logs itself when it ends; this task ends now so that the
                // open tunnel does not keep an HTTP connection's state.
                worker.give_buf(std::mem::take(&mut c.buf));
                let label = c.logged.boxed();
                let Client { guard, stream, peer, listener, user, tls, .. } = c;
                let record = crate::front::tunnel::Record {
                    peer,
                    tls,
                    user,
                    label,
                    status: ex.status,
                    start: ex.start,
                    upstream: ex.upstream,
                    via: ex.via.take(),
                    up: ex.moved[0].get(),
                    down: ex.moved[1].get(),
                };
                let opts = worker.relay_opts(listener.splice);
                crate::front::tunnel::spawn(guard, stream, handoff, opts, record);
                return;
            }
            Ok(next) => {
                c.log(&ex, None);
                next
            }
            Err(e) => {
                c.fail(&mut ex, &e).await;
                clean = false;
                Next::Close
            }
        };
        if matches!(next, Next::Close) || worker.stopping.get() {
            break;
        }
    }
    worker.give_buf(std::mem::take(&mut c.buf));
    worker.give_out(std::mem::take(&mut c.out));
    // A TLS session this side ends ends with close_notify: without it a client cannot
    // tell a whole close-delimited answer from a cut one (GnuTLS clients fail the
    // session). `fail` ends its own sessions, and sends nothing after a cut answer, whose
    // missing close_notify is the client's sign of it. A plain connection's close says
    // all (no shutdown syscall for it).
    if clean && c.stream.is_tls() {
        let _ = tokio::time::timeout(ERROR_WRITE_TIMEOUT, c.stream.shutdown()).await;
    }
}

/// Answers a connection over the limit with 503 and closes it.
pub(crate) async fn refuse_overloaded(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: Stream,
    peer: SocketAddr,
) {
    let worker = guard.worker().clone();
    let mut c = Client {
        guard,
        worker,
        user: None,
        params: None,
        auth_seen: Vec::new(),
        auth_gen: 0,
        traffic: None,
        listener,
        stream,
        peer,
        buf: Buf::default(),
        head: RequestHead::new(),
        out: Vec::new(),
        key: forward::PoolKey::default(),
        pins: Default::default(),
        logged: Label::default(),
        tls: None,
        cert_auth: false,
    };
    // Read what the client already sent (its request is usually there: the listener defers
    // accepts until it is), so that closing after the answer sends a FIN, not a reset that
    // could discard the 503 before the client reads it.
    let mut scratch = [0u8; 4096];
    let mut read = ReadBuf::new(&mut scratch);
    let _ = crate::io::idle::poll_once(std::pin::pin!(std::future::poll_fn(|cx| {
        std::pin::Pin::new(&mut c.stream).poll_read(cx, &mut read)
    })))
    .await;
    let mut ex = Exchange::new(Instant::now());
    c.logged.clear(Protocol::Http, Version::Unknown);
    if c.listener.h2c && rustle_proto::detect::is_h2_preface(read.filled()) {
        // An HTTP/2 client (prior knowledge) reads frames, not a status line: it gets the
        // server preface and a GOAWAY that refuses every stream (last stream 0), with the
        // cause as its debug data.
        let _ = tokio::time::timeout(ERROR_WRITE_TIMEOUT, async {
            c.stream.write_all(&h2_refusal(Error::Overloaded.to_string().as_bytes())).await?;
            c.stream.flush().await?;
            c.stream.shutdown().await
        })
        .await;
        ex.status = 503;
        c.log(&ex, Some(&Error::Overloaded));
        return;
    }
    c.fail(&mut ex, &Error::Overloaded).await;
}

/// HTTP/2's refusal of a whole connection: an empty SETTINGS frame (the server's preface)
/// then GOAWAY with last stream 0 and REFUSED_STREAM (RFC 9113 6.8: no stream was
/// processed, so a client may try again elsewhere), `why` as debug data.
fn h2_refusal(why: &[u8]) -> Vec<u8> {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const REFUSED_STREAM: u32 = 0x7;
    let len = 8 + why.len();
    let mut out = Vec::with_capacity(9 + 9 + len);
    out.extend_from_slice(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]);
    // A frame length is 24 bits; the debug data is one short message.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(0).to_be_bytes()[1..]);
    out.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&REFUSED_STREAM.to_be_bytes());
    out.extend_from_slice(why);
    out
}

impl Client {
    /// Reads until a whole request head is parsed. `Ok(false)`: the client closed (or its
    /// idle wait ended: keep-alive timeout, a drain's idle grace) between requests, which is
    /// not an error. A draining worker still reads a request that comes, and answers it
    /// with `Connection: close`.
    async fn read_head(&mut self) -> Result<bool, Error> {
        let limits = self.worker.limits();
        let timeouts = &self.worker.cfg().timeouts;
        let mut deadline = None;
        loop {
            if !self.buf.is_empty() {
                if parse_request(self.buf.filled(), &limits, &mut self.head)?.is_some() {
                    return Ok(true);
                }
                // A slow-header client gets the header timeout from its first byte on.
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeouts.header);
            }
            // A request that is already there (pipelined, or sent right after connecting)
            // is read without arming a timer.
            let first = {
                let read = self.buf.read_from(&mut self.stream, limits.max_head);
                crate::io::idle::poll_once(std::pin::pin!(read)).await
            };
            let n = match (first, deadline) {
                (Some(r), _) => r,
                (None, Some(d)) => {
                    let read = self.buf.read_from(&mut self.stream, limits.max_head);
                    match tokio::time::timeout_at(d, read).await {
                        Ok(r) => r,
                        Err(_) => return Err(Error::Timeout(Phase::ClientHead)),
                    }
                }
                // Between requests: the worker's waiters end the wait at the keep-alive
                // timeout or at shutdown (no timer of its own).
                (None, None) => {
                    let deadline = self.worker.waiters.deadline(timeouts.keepalive);
                    let waiters = &self.worker.waiters;
                    match self.stream.tcp() {
                        // A plain connection waits without its read buffer: idle
                        // connections hold no buffer (it goes back to the worker's pool).
                        Some(tcp) if self.buf.is_empty() => {
                            self.worker.give_buf(std::mem::take(&mut self.buf));
                            self.worker.give_out(std::mem::take(&mut self.out));
                            let ready = std::future::poll_fn(|cx| tcp.poll_read_ready(cx));
                            let woke = waiters.wait(ready, deadline).await;
                            self.buf = self.worker.take_buf();
                            match woke {
                                Some(Ok(())) => continue,
                                Some(Err(e)) => return Err(Error::Client(e)),
                                None => return Ok(false),
                            }
                        }
                        _ => {
                            let read = self.buf.read_from(&mut self.stream, limits.max_head);
                            match waiters.wait(std::pin::pin!(read), deadline).await {
                                Some(r) => r,
                                // An idle kept-alive connection just closes.
                                None => return Ok(false),
                            }
                        }
                    }
                }
            };
            match n {
                Ok(0) if self.buf.is_empty() => return Ok(false),
                Ok(0) => return Err(Error::ClientTruncated),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => {
                    // The buffer is at max_head and the parser still wants more.
                    return Err(Error::BadRequest(rustle_proto::http::HeadError::HeadTooLarge));
                }
                Err(e) => return Err(Error::Client(e)),
            }
        }
    }

    async fn handle(&mut self, ex: &mut Exchange) -> Result<Next, Error> {
        if self.listener.auth && !self.cert_auth {
            self.authenticate().await?;
        }
        // A user over quota: one relaxed load per request.
        if let Some(e) = self.traffic.as_deref().and_then(crate::limits::UserTraffic::over_quota) {
            return Err(e);
        }
        let head = &self.head;
        if matches!(head.method, Method::Options | Method::Trace) && head.max_forwards == Some(0) {
            return self.answer_max_forwards(ex).await;
        }
        match head.target {
            Target::Authority { .. } => connect::tunnel(self, ex).await,
            // https:// (and wss:// in an upgrade) in absolute form, as squid takes it: TLS
            // is originated here.
            Target::Absolute { .. } => forward::forward(self, ex).await.map_err(|e| {
                e.through(ex.via.as_deref().map(crate::telemetry::accesslog::Via::last_parent))
            }),
            Target::Origin { .. } | Target::Asterisk => Err(Error::Unsupported(
                "this is a forward proxy: requests need an absolute URI such as \
                 http://host/path (or CONNECT host:port)",
            )),
        }
    }

    /// `Proxy-Authorization: Basic`, checked once per connection while it stays the same.
    async fn authenticate(&mut self) -> Result<(), Error> {
        let Some(value) = self.head.header(self.buf.filled(), "proxy-authorization") else {
            return Err(Error::AuthRequired("credentials required"));
        };
        let generation = self.worker.users_generation();
        if self.user.is_some() && value == self.auth_seen.as_slice() && generation == self.auth_gen
        {
            return Ok(());
        }
        let value = value.to_vec();
        let mut scratch = Vec::new();
        let negotiated;
        let (user, params) = match crate::policy::auth::parse_basic(&value, &mut scratch) {
            Ok((user, password)) => {
                let protocol = match self.head.target {
                    Target::Authority { .. } => "connect",
                    _ => "http",
                };
                let l = &self.listener;
                let origin = crate::policy::auth::Origin {
                    listener: l.name.as_deref(),
                    addr: l.listen,
                    protocol,
                };
                self.worker.authenticate(origin, self.peer.ip(), user, password).await?
            }
            // Not Basic: Negotiate, where `[auth.kerberos]` accepts it.
            Err(_) => {
                negotiated = self.worker.negotiate(self.peer.ip(), &value)?;
                (negotiated.as_str(), None)
            }
        };
        if self.user.as_deref().is_some_and(|u| u != user) {
            // The connection is counted against its first user's limit.
            return Err(Error::AuthRequired("a connection cannot change users"));
        }
        let fd = self.stream.raw_fd();
        self.guard.hold_user(user, self.peer.ip(), fd)?;
        if self.user.is_none() {
            let entry = self.guard.user_entry();
            self.traffic = Some(entry.unwrap_or_else(|| self.worker.traffic.entry(user)));
        }
        self.user = Some(Rc::from(user));
        self.params = params.map(Rc::new);
        self.auth_seen = value;
        self.auth_gen = generation;
        Ok(())
    }

    /// The bandwidth limits of this connection: its listener's and its user's.
    pub(crate) fn throttle(&self) -> crate::limits::Throttle {
        self.worker.throttle(&self.listener.throttle, self.user.as_deref())
    }

    /// A connection to `host:port` from the upstream layer (`upstream::Upstreams`): a
    /// pooled one under `key` when there is one, or a new one, given up as soon as the
    /// client leaves (`Error::ClientLeft(Phase::Connect)`). What the client sends meanwhile
    /// (a tunnel's first bytes, a pipelined request) is kept in `buf`.
    pub(crate) async fn upstream(
        &mut self,
        key: Option<&[u8]>,
        host: &str,
        port: u16,
        protocol: crate::acl::Protocol,
        tls: Tls<'_>,
    ) -> Result<Connected, Error> {
        let worker = self.worker.clone();
        let policy = worker.policy();
        let want = Want {
            host,
            port,
            protocol,
            client: self.peer.ip(),
            addrs: (&self.peer, &self.listener.listen),
            user: self.user.as_deref(),
            listener: self.listener.name.as_deref(),
            tls,
            local: crate::upstream::local_of(&policy, || self.stream.local_addr()),
            params: self.params.as_deref(),
            seed: None,
        };
        let key = key.map(|k| worker.upstreams.key(k));
        let (stream, buf, max) = (&mut self.stream, &mut self.buf, worker.limits().max_head);
        let tunnel = protocol == crate::acl::Protocol::Connect;
        crate::front::exchange::connect(&worker, &policy, &want, key, || {
            crate::front::exchange::client_left(stream, buf, max, Phase::Connect, tunnel)
        })
        .await
    }

    /// RFC 9110 7.6.2: an OPTIONS or TRACE with Max-Forwards 0 is answered by the proxy.
    async fn answer_max_forwards(&mut self, ex: &mut Exchange) -> Result<Next, Error> {
        let keep = self.head.keep_alive()
            && self.head.body == rustle_proto::http::BodyKind::None
            && !self.worker.stopping.get();
        self.out.clear();
        let conn = if keep { "" } else { "Connection: close\r\n" };
        if self.head.method == Method::Trace {
            let echoed = &trace_echo(&self.head, self.buf.filled());
            let _ = write!(
                self.out,
                "HTTP/1.1 200 OK\r\nContent-Type: message/http\r\nContent-Length: {}\r\n{conn}\r\n",
                echoed.len()
            );
            self.out.extend_from_slice(echoed);
        } else {
            let _ = write!(
                self.out,
                "HTTP/1.1 200 OK\r\nAllow: GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH, \
                 CONNECT\r\nContent-Length: 0\r\n{conn}\r\n"
            );
        }
        self.buf.consume(self.head.len);
        ex.status = 200;
        ex.responded = true;
        self.stream.write_all(&self.out).await.map_err(Error::Client)?;
        self.stream.flush().await.map_err(Error::Client)?;
        Ok(if keep { Next::KeepAlive } else { Next::Close })
    }

    /// Keeps what the record of the request just parsed shows (the head is consumed by
    /// the time it ends): its protocol and version, and for the log line its method,
    /// target, and User-Agent and Referer when the log shows them.
    fn keep_for_log(&mut self) {
        let buf = self.buf.filled();
        let (head, l) = (&self.head, &mut self.logged);
        let protocol = match head.method {
            Method::Connect => Protocol::Connect,
            _ => Protocol::Http,
        };
        l.clear(protocol, Version::http1(head.minor));
        if !self.worker.log.enabled() {
            return;
        }
        l.push(head.method_span.get(buf));
        l.push(head.target_span.get(buf));
        if self.worker.log.wants_headers() {
            l.push(head.header(buf, "user-agent").unwrap_or_default());
            l.push(head.header(buf, "referer").unwrap_or_default());
        }
    }

    /// For a request refused before its head was whole or valid: what its request line
    /// said, as far as it got (the method, the target, the version), for the record.
    fn keep_request_line(&mut self) {
        let (method, target, version) = request_line(self.buf.filled());
        let version = match version {
            b"HTTP/1.0" => Version::Http10,
            b"HTTP/1.1" => Version::Http11,
            _ => Version::Unknown,
        };
        let protocol = match method {
            b"CONNECT" => Protocol::Connect,
            _ => Protocol::Http,
        };
        self.logged.clear(protocol, version);
        if self.worker.log.enabled() {
            self.logged.push(method);
            self.logged.push(target);
        }
    }

    /// Answers an error if the client can still be told, and logs it.
    pub(crate) async fn fail(&mut self, ex: &mut Exchange, e: &Error) {
        if let (false, Some(status)) = (ex.responded, e.status()) {
            self.out.clear();
            let body = e.to_string();
            let _ = write!(self.out, "HTTP/1.1 {status} {}\r\n", reason(status));
            if status == 407 {
                let policy = self.worker.policy();
                let realm = policy.realm.replace(['"', '\\'], "");
                if policy.negotiate.is_some() {
                    self.out.extend_from_slice(b"Proxy-Authenticate: Negotiate\r\n");
                }
                let _ = write!(self.out, "Proxy-Authenticate: Basic realm=\"{realm}\"\r\n");
            }
            let _ = write!(
                self.out,
                "Content-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}\n",
                body.len() + 1
            );
            let write = async {
                self.stream.write_all(&self.out).await?;
                self.stream.flush().await
            };
            if let Ok(Ok(())) = tokio::time::timeout(ERROR_WRITE_TIMEOUT, write).await {
                let _ = self.stream.shutdown().await;
            }
            ex.status = status;
            ex.responded = true;
        } else if ex.responded && ex.unframed {
            self.stream.reset_on_close();
        }
        self.log(ex, Some(e));
    }

    /// An exchange's end (`exchange::end`): the user's traffic, the metrics, the log line.
    pub(crate) fn log(&self, ex: &Exchange, error: Option<&Error>) {
        let l = &self.logged;
        let record = Record {
            client: self.peer,
            listener: &self.listener,
            counters: &self.listener.counters,
            user: self.user.as_deref(),
            protocol: l.protocol,
            version: l.version,
            label: l,
            upstream: ex.upstream,
            via: ex.via.as_deref(),
            status: ex.status,
            up: ex.moved[0].get(),
            down: ex.moved[1].get(),
            start: ex.start,
            tunnel: false,
            tls: self.tls.as_deref(),
            error: None,
            refused: None,
            // The bodies went on the user's counters as they moved.
            counted: match self.traffic {
                Some(_) => (ex.moved[0].get(), ex.moved[1].get()),
                None => (0, 0),
            },
        };
        crate::front::exchange::end(&self.worker, self.traffic.as_deref(), record, error);
    }
}

/// Most of a target a refused request's log line shows.
const REFUSED_TARGET_MAX: usize = 1024;

/// The tokens of a request line that was not accepted, as far as they are printable
/// ASCII: the method, the target (cut at `REFUSED_TARGET_MAX`) and the version; empty
/// where there was none.
fn request_line(buf: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut tokens = line.split(|&b| b == b' ');
    let mut next = |max: usize| {
        let t = tokens.next().unwrap_or_default();
        let t = &t[..t.len().min(max)];
        match t.iter().all(u8::is_ascii_graphic) {
            true => t,
            false => &[][..],
        }
    };
    let method = next(32);
    let target = next(REFUSED_TARGET_MAX);
    let version = next(8);
    (method, target, version)
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// The head a TRACE answered here echoes: the request as received, less its
/// `Proxy-Authorization` fields (the client's credentials for this proxy, which
/// nothing past it sees; squid strips them alike). Allocates, on this rare path only.
fn trace_echo(head: &RequestHead, buf: &[u8]) -> Vec<u8> {
    let received = buf.get(..head.len).unwrap_or(buf);
    let mut echoed = Vec::with_capacity(received.len());
    let mut from = 0;
    for h in &head.headers {
        if !h.name.get(received).eq_ignore_ascii_case(b"proxy-authorization") {
            continue;
        }
        // The field's line, up to and with its line end (CRLF, checked by the parser).
        let (start, end) = (h.name.start as usize, h.value.end as usize);
        let line_end = received
            .get(end..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
            .map_or(received.len(), |i| end + i + 1);
        echoed.extend_from_slice(received.get(from..start).unwrap_or_default());
        from = line_end;
    }
    echoed.extend_from_slice(received.get(from..).unwrap_or_default());
    echoed
}
