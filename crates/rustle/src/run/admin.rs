//! The admin endpoint (`[admin] listen`): Prometheus metrics at `/metrics`, `/healthz`
//! (the process answers) and `/readyz` (listeners bound, not draining), for scrapers, load
//! balancers and Kubernetes probes. It runs on a thread of its own with a small
//! current-thread runtime, so that a scrape never runs on a worker; it answers one request
//! per connection (HTTP/1.1, `Connection: close`), with a bounded head and a deadline.
//! `server` starts it; nothing below `server` imports it. `/api/v1/users` (`users`)
//! manages users while the proxy runs; it answers only with a token configured.
//!
//! Under abuse it stays available to the probes that matter: a client outside `allow` is
//! closed at accept (no slot, no read); a client has `HEAD_TIMEOUT` from connecting to
//! the end of its request head; and when every slot is taken, a new connection closes
//! the one that has waited longest for its head. A connection that has sent its head is
//! never closed for room, so silent or dripping connections, from any number of
//! addresses, delay a probe (which sends its head at once) by one accept at most. No
//! per-address cap: probes and scrapers often share an address with others (kubelet
//! connects from the node's address, every test from 127.0.0.1).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

use crate::config::Admin;
use crate::policy::Policy;
use crate::telemetry::metrics::{
    self, ListenerLabel, ParentView, Readiness, RouteView, WorkerStats,
};

mod users;

pub(crate) use users::UsersState;

/// The largest request head taken; a scraper's is a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;

/// The largest request body taken (the users API's JSON): a user with its groups and
/// limits is a few hundred bytes.
const MAX_BODY: usize = 16 * 1024;

/// Failed token checks one client address may make in `FAILURE_WINDOW` before it is
/// answered 429 without a check.
const MAX_FAILURES: u32 = 10;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Client addresses whose failures are remembered at once (beyond, the oldest windows
/// are forgotten first).
const MAX_FAILING_CLIENTS: usize = 1024;

/// Failed token checks from all addresses together in `FAILURE_WINDOW` before every
/// wrong token is answered 429 without a check (guessers rotating addresses, IPv6
/// sources, share it); the right token and the probes are never refused for it.
const MAX_ALL_FAILURES: u32 = 100;

/// How long a client has from connecting to the end of its request head. Scrapers and
/// probes send theirs at once, in one packet; the bound is tight so that silent
/// connections give their slots back soon even when nothing evicts them.
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client has, once its head is in, to take the answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once (a scraper or probe needs one at a time). When all are
/// taken, the one that has waited longest for its head is closed to make room; only
/// when every one of them is being answered does a new connection wait for a slot.
const MAX_CONNECTIONS: usize = 64;

/// What the admin thread reads.
pub(crate) struct State {
    pub(crate) workers: Vec<Arc<WorkerStats>>,
    pub(crate) readiness: Arc<Readiness>,
    /// The quotas, for their usage in `/metrics`.
    pub(crate) quotas: Arc<crate::state::Keeper>,
    /// The listeners and the policy in force (a reload replaces them).
    pub(crate) view: watch::Receiver<Arc<View>>,
    /// True once a shutdown began: `/readyz` then says draining.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The fleet's shared state, with `[state] backend = "redis"`.
    pub(crate) fleet: Option<crate::state::fleet::FleetHandle>,
    /// What the users API changes.
    pub(crate) users: UsersState,
}

/// What a scrape reports on that a reload changes.
pub(crate) struct View {
    /// The listeners bound, with their counters.
    pub(crate) listeners: Vec<ListenerLabel>,
    /// The policy in force, for the parents and their health.
    pub(crate) policy: Arc<Policy>,
}

/// The running admin endpoint.
pub(crate) struct Handle {
    pub(crate) addr: SocketAddr,
    /// The address configured (port 0 as configured), under which a takeover hands the
    /// socket over.
    pub(crate) configured: SocketAddr,
    /// The main thread's copy of the listening socket, for a takeover.
    socket: std::net::TcpListener,
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Handle {
    /// The listening socket.
    pub(crate) fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.socket.as_fd()
    }

    /// Stops accepting (the socket stays open for a process that took it over); answers
    /// under way finish.
    pub(crate) fn stop_accepting(&self) {
        let _ = self.stop.send(true);
    }

    /// Stops answering (once the workers are done) and waits for the thread.
    pub(crate) fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

/// Binds the admin endpoint's socket: before the policy is built, which refuses its
/// address as a destination.
pub(crate) fn bind(listen: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(listen)
        .with_context(|| format!("cannot listen on {listen} (admin)"))
}

/// Starts the admin thread on `listener`: bound by `bind`, or the socket of a process
/// taken over or of the service manager; `listen` is the address configured for it.
pub(crate) fn start(
    cfg: &Admin,
    listen: SocketAddr,
    listener: std::net::TcpListener,
    state: State,
) -> anyhow::Result<Handle> {
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let socket = listener.try_clone()?;
    let (stop, stopped) = watch::channel(false);
    let digest =
        |t: crate::config::Secret| <sha2::Sha256 as sha2::Digest>::digest(t.expose()).into();
    let token = cfg.read_token().map_err(anyhow::Error::msg)?;
    let api_token = cfg.read_api_token().map_err(anyhow::Error::msg)?;
    let server = Arc::new(Server {
        token: token.map(digest),
        api_token: api_token.map(digest),
        failures: std::sync::Mutex::new(std::collections::HashMap::new()),
        all_failures: std::sync::Mutex::new(None),
        allow: cfg.allow.clone(),
        max_user_series: cfg.max_user_series,
        started: Instant::now(),
        start_time: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default(),
        state,
    });
    let api = server.api_token.is_some();
    let thread = std::thread::Builder::new().name("rustle-admin".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!("admin: cannot start a runtime: {e}");
                return;
            }
        };
        rt.block_on(serve(server, listener, stopped));
    })?;
    metrics::set_timed();
    match api {
        true => tracing::info!(
            "admin endpoint on http://{addr}/metrics (also /healthz, /readyz, /api/v1/users)"
        ),
        false => tracing::info!(
            "admin endpoint on http://{addr}/metrics (also /healthz, /readyz; the users API \
             needs [admin] api_token_file)"
        ),
    }
    Ok(Handle { addr, configured: listen, socket, stop, thread })
}

struct Server {
    /// The token's SHA-256: what a presented token's digest is compared with, in
    /// constant time whatever the lengths.
    token: Option<[u8; 32]>,
    /// The users API's token's SHA-256 (`[admin] api_token`); None: the API is off.
    api_token: Option<[u8; 32]>,
    /// Failed token checks per client address: the start of its window and the count.
    failures: std::sync::Mutex<std::collections::HashMap<IpAddr, (Instant, u32)>>,
    /// Failed token checks from all addresses: the start of the window and the count
    /// (`MAX_ALL_FAILURES`).
    all_failures: std::sync::Mutex<Option<(Instant, u32)>>,
    allow: Vec<crate::acl::Cidr>,
    max_user_series: usize,
    started: Instant,
    start_time: Duration,
    state: State,
}

async fn serve(
    server: Arc<Server>,
    listener: std::net::TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("admin: cannot use the listener: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let waiting = Arc::new(Waiting::default());
    loop {
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("admin: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        // Refused before anything is read or held: a slot is only for allowed clients.
        if !server.allowed(peer.ip()) {
            tracing::debug!("admin: {peer}: closed at accept, not in [admin] allow");
            continue;
        }
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => Ok(p),
            Err(_) => {
                if let Some(evicted) = waiting.evict_oldest() {
                    tracing::debug!(
                        "admin: all {MAX_CONNECTIONS} slots taken; closing the connection \
                         waiting longest for its request head (from {evicted})"
                    );
                }
                tokio::select! {
                    p = slots.clone().acquire_owned() => p,
                    _ = stop.changed() => break,
                }
            }
        };
        let Ok(permit) = permit else { break };
        let (id, evicted) = waiting.enter(peer);
        let (server, waiting_conn) = (server.clone(), waiting.clone());
        tokio::spawn(async move {
            let _permit = permit;
            // Only an eviction ends it early: `leave` drops the sender, which disables
            // this branch (the pattern does not match) rather than firing it.
            tokio::select! {
                () = answer(&server, stream, peer, || waiting_conn.leave(id)) => {}
                Ok(()) = evicted => {}
            }
            waiting_conn.leave(id);
        });
        // The new connection's task reads its head (usually there already) before the
        // next accept can evict it.
        tokio::task::yield_now().await;
    }
    // Not accepting any more (a takeover: the new process accepts on the same socket);
    // answers under way finish within their deadline, and connections still silent close.
    drop(listener);
    while waiting.evict_oldest().is_some() {}
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(HEAD_TIMEOUT + REQUEST_TIMEOUT, slots.acquire_many(all)).await;
}

/// The connections still waiting for their request head, oldest first, each with the
/// sender that closes it.
#[derive(Default)]
struct Waiting {
    inner: std::sync::Mutex<WaitingInner>,
}

#[derive(Default)]
struct WaitingInner {
    next: u64,
    by_age: std::collections::BTreeMap<u64, (SocketAddr, oneshot::Sender<()>)>,
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitingInner> {
        // The admin thread alone takes it; a poisoned lock still holds plain values.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new connection: its number, and what fires when it is evicted.
    fn enter(&self, peer: SocketAddr) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut w = self.lock();
        let id = w.next;
        w.next += 1;
        w.by_age.insert(id, (peer, tx));
        (id, rx)
    }

    /// The connection's head is in (or it ended): it can no longer be evicted.
    fn leave(&self, id: u64) {
        self.lock().by_age.remove(&id);
    }

    /// Closes the connection that has waited longest for its head; its address.
    fn evict_oldest(&self) -> Option<SocketAddr> {
        let (_, (peer, tx)) = self.lock().by_age.pop_first()?;
        let _ = tx.send(());
        Some(peer)
    }
}

/// An answer: status, extra header lines, content type, body.
struct Reply {
    status: u16,
    headers: &'static str,
    content_type: &'static str,
    body: String,
}

impl Reply {
    /// A JSON answer.
    fn json(status: u16, value: &serde_json::Value) -> Reply {
        let mut body = value.to_string();
        body.push('\n');
        Reply { status, headers: "", content_type: "application/json", body }
    }

    /// A JSON error: `{"error": "..."}`.
    fn error(status: u16, message: &str) -> Reply {
        Reply::json(status, &serde_json::json!({ "error": message }))
    }

    fn text(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: "",
            content_type: "text/plain; charset=utf-8",
            body: format!("{body}\n"),
        }
    }
}

/// Reads one request head within `HEAD_TIMEOUT` (`head_in` is called once it is in) and
/// writes the answer within `REQUEST_TIMEOUT`.
async fn answer(server: &Server, mut stream: TcpStream, peer: SocketAddr, head_in: impl FnOnce()) {
    let Ok(read) = tokio::time::timeout(HEAD_TIMEOUT, read_request(&mut stream)).await else {
        tracing::debug!("admin: {peer}: no whole request head within {HEAD_TIMEOUT:?}; closed");
        return;
    };
    let Some(read) = read else { return };
    head_in();
    let (reply, head_only) = match read {
        Ok(req) => (server.route(&req, peer).await, req.method == "HEAD"),
        Err(reply) => (reply, false),
    };
    if reply.status >= 400 {
        tracing::debug!("admin: {peer}: {} {}", reply.status, reply.body.trim_end());
    }
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
        reply.status,
        reason(reply.status),
        reply.content_type,
        reply.body.len(),
        reply.headers,
    );
    let mut out = head.into_bytes();
    if !head_only {
        out.extend_from_slice(reply.body.as_bytes());
    }
    let write = async {
        if stream.write_all(&out).await.is_ok() {
            let _ = stream.shutdown().await;
        }
    };
    if tokio::time::timeout(REQUEST_TIMEOUT, write).await.is_err() {
        tracing::debug!("admin: {peer}: did not take the answer within {REQUEST_TIMEOUT:?}");
    }
}

/// A request read whole: what the routes look at.
struct Request {
    method: String,
    /// The path, without the query.
    path: String,
    /// The `Authorization: Bearer` value, if any.
    bearer: Option<Vec<u8>>,
    body: Vec<u8>,
}

/// The request read from `stream` (its head, then a body of `Content-Length` bytes), or
/// the answer to a request that cannot be served; None when the client left first.
async fn read_request(stream: &mut TcpStream) -> Option<Result<Request, Reply>> {
    let mut buf = Vec::with_capacity(1024);
    let (mut req, head_len, body_len) = loop {
        let mut chunk = [0u8; 1024];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => match head_of(&parsed) {
                Ok((req, body_len)) => break (req, n, body_len),
                Err(reply) => return Some(Err(reply)),
            },
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Some(Err(Reply::text(431, "request head too large (at most 8 KiB)")));
            }
            Err(e) => return Some(Err(Reply::text(400, &format!("malformed request: {e}")))),
        }
    };
    while buf.len() < head_len + body_len {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    req.body = buf.get(head_len..head_len + body_len).unwrap_or_default().to_vec();
    Some(Ok(req))
}

/// The parts of a parsed head the routes read, and the length of its body.
fn head_of(parsed: &httparse::Request<'_, '_>) -> Result<(Request, usize), Reply> {
    let header = |name: &str| {
        parsed.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
    };
    if header("transfer-encoding").is_some() {
        return Err(Reply::error(411, "send the body with a Content-Length"));
    }
    let body_len = match header("content-length") {
        None => 0,
        Some(v) => match std::str::from_utf8(v).ok().and_then(|v| v.trim().parse().ok()) {
            Some(n) if n <= MAX_BODY => n,
            Some(_) => return Err(Reply::error(413, "request body too large (at most 16 KiB)")),
            None => return Err(Reply::error(400, "malformed Content-Length")),
        },
    };
    let path = parsed.path.unwrap_or("/");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let bearer =
        header("authorization").and_then(|v| v.strip_prefix(b"Bearer ")).map(<[u8]>::to_vec);
    let method = parsed.method.unwrap_or_default().to_string();
    Ok((Request { method, path: path.to_string(), bearer, body: Vec::new() }, body_len))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        201 => "Created",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

impl Server {
    /// Whether `client` may connect at all (`[admin] allow`; anyone without it).
    fn allowed(&self, client: IpAddr) -> bool {
        self.allow.is_empty() || self.allow.iter().any(|c| c.contains(client))
    }

    /// The answer to a request of an allowed client.
    async fn route(&self, req: &Request, peer: SocketAddr) -> Reply {
        let api = req.path == "/api" || req.path.starts_with("/api/");
        let token = match api {
            true => match &self.api_token {
                Some(t) => Some(t),
                None => {
                    return Reply::error(
                        403,
                        "the users API is off: set [admin] api_token_file and restart",
                    )
                }
            },
            false => self.token.as_ref(),
        };
        if let Some(token) = token {
            let given: Option<[u8; 32]> =
                req.bearer.as_deref().map(|g| <sha2::Sha256 as sha2::Digest>::digest(g).into());
            let ok =
                given.is_some_and(|g| subtle::ConstantTimeEq::ct_eq(&g[..], &token[..]).into());
            if !ok {
                // Only wrong tokens are guesses: they count, and past the budget they get
                // 429; the probes (`/healthz`, `/readyz`) are never throttled.
                let probe = matches!(req.path.as_str(), "/healthz" | "/readyz");
                if req.bearer.is_some() && !probe {
                    if self.throttled(peer.ip()) {
                        return Reply::error(429, "too many failed token checks: wait a minute");
                    }
                    self.failed(peer.ip());
                }
                let why = match req.bearer {
                    Some(_) => "a wrong token",
                    None => "no token",
                };
                tracing::warn!("admin: {peer}: {} {} with {why}: 401", req.method, req.path);
                let mut r = match api {
                    true => Reply::error(401, "unauthorized: send Authorization: Bearer TOKEN"),
                    false => Reply::text(401, "unauthorized: send Authorization: Bearer TOKEN"),
                };
                r.headers = "WWW-Authenticate: Bearer realm=\"rustle admin\"\r\n";
                return r;
            }
        }
        if api {
            return users::answer(&self.state.users, &self.state.view, req, peer).await;
        }
        let path = req.path.as_str();
        if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
            return Reply::text(
                404,
                &format!("not found: {path} (try /metrics, /healthz, /readyz)"),
            );
        }
        if !matches!(req.method.as_str(), "GET" | "HEAD") {
            let mut r = Reply::text(405, "method not allowed: use GET");
            r.headers = "Allow: GET, HEAD\r\n";
            return r;
        }
        match path {
            "/healthz" => Reply::text(200, "ok"),
            "/readyz" => {
                if *self.state.shutdown.borrow() {
                    self.state.readiness.set_draining();
                }
                match self.state.readiness.check() {
                    Ok(()) => self.fleet_readiness(),
                    Err(why) => Reply::text(503, why),
                }
            }
            _ => Reply {
                status: 200,
                headers: "",
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body: self.metrics(),
            },
        }
    }

    /// `/readyz` of a ready process in a fleet: while its Redis is unreachable, 503 when
    /// it refuses authenticated connections (`on_state_loss = "deny"`, so a balancer
    /// sends them elsewhere), else 200 saying it serves degraded.
    fn fleet_readiness(&self) -> Reply {
        let Some(fleet) = &self.state.fleet else { return Reply::text(200, "ready") };
        let (up, since) = fleet.status().health();
        if up {
            return Reply::text(200, "ready");
        }
        let since = since.elapsed().map_or(0, |d| d.as_secs());
        let addr = fleet.addr();
        match fleet.on_state_loss() {
            crate::config::OnStateLoss::Deny => Reply::text(
                503,
                &format!(
                    "state store unavailable: Redis at {addr} unreachable for {since} s; \
                     refusing authenticated connections (on_state_loss = \"deny\")"
                ),
            ),
            crate::config::OnStateLoss::Serve => Reply::text(
                200,
                &format!(
                    "ready, degraded: state store Redis at {addr} unreachable for {since} s; \
                     serving on local counts (on_state_loss = \"serve\")"
                ),
            ),
        }
    }

    /// Whether `client` failed the token check too often of late.
    fn throttled(&self, client: IpAddr) -> bool {
        let all = *self.all_failures.lock().unwrap_or_else(|p| p.into_inner());
        if all.is_some_and(|(since, n)| n >= MAX_ALL_FAILURES && since.elapsed() < FAILURE_WINDOW) {
            return true;
        }
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures
            .get(&client)
            .is_some_and(|(since, n)| *n >= MAX_FAILURES && since.elapsed() < FAILURE_WINDOW)
    }

    /// Counts a failed token check of `client`.
    fn failed(&self, client: IpAddr) {
        let now = Instant::now();
        {
            let mut all = self.all_failures.lock().unwrap_or_else(|p| p.into_inner());
            let (since, n) = all.get_or_insert((now, 0));
            if now.duration_since(*since) >= FAILURE_WINDOW {
                (*since, *n) = (now, 0);
            }
            *n += 1;
        }
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() >= MAX_FAILING_CLIENTS && !failures.contains_key(&client) {
            failures.retain(|_, (since, _)| now.duration_since(*since) < FAILURE_WINDOW);
            if failures.len() >= MAX_FAILING_CLIENTS {
                let oldest = failures.iter().min_by_key(|(_, (since, _))| *since).map(|(a, _)| *a);
                if let Some(oldest) = oldest {
                    failures.remove(&oldest);
                }
            }
        }
        let entry = failures.entry(client).or_insert((now, 0));
        if now.duration_since(entry.0) >= FAILURE_WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }

    fn metrics(&self) -> String {
        let view = self.state.view.borrow().clone();
        let now = Instant::now();
        let parents: Vec<ParentView> = view
            .policy
            .routes
            .parents()
            .iter()
            .map(|p| ParentView {
                name: p.name.to_string(),
                up: p.is_up(now),
                failures: p.health.stats.failures.load(std::sync::atomic::Ordering::Relaxed),
                connect: p.health.stats.connect.summed(),
                traffic: p.health.stats.traffic.summed(),
                probe: p.health.stats.last_probe(),
            })
            .collect();
        let routes: Vec<RouteView> = view
            .policy
            .routes
            .route_list()
            .map(|(name, c)| RouteView { name: name.to_string(), traffic: c.summed() })
            .collect();
        let process = metrics::Process {
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64),
            max_fds: rlimit::Resource::NOFILE.get().ok().map(|(soft, _)| soft),
            resident_bytes: resident_bytes(),
            cpu_seconds: cpu_seconds(),
            start_time: self.start_time.as_secs_f64(),
            uptime: self.started.elapsed(),
            workers: self.state.workers.len(),
        };
        let quotas = self.state.quotas.metrics();
        let mut text = metrics::render(&metrics::Scrape {
            quotas: &quotas,
            listeners: &view.listeners,
            workers: &self.state.workers,
            max_user_series: self.max_user_series,
            parents: &parents,
            routes: &routes,
            process: &process,
        });
        if let Some(fleet) = &self.state.fleet {
            state_metrics(&mut text, fleet);
        }
        auth_backend_metrics(&mut text, &view.policy.backends);
        kernel_metrics(&mut text);
        text
    }
}

/// In-kernel forwarding: whether the kernel forwards here, and the tunnels it took.
fn kernel_metrics(out: &mut String) {
    use crate::io::relay::kernel;
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering::Relaxed;
    let name = "rustle_kernel_forwarding_available";
    let _ = writeln!(
        out,
        "# HELP {name} Whether the kernel can forward tunnels here (sockhash and stream verdict).\n\
         # TYPE {name} gauge\n{name} {}",
        u8::from(kernel::available())
    );
    let name = "rustle_kernel_forwarding_tunnels_total";
    let _ = write!(
        out,
        "# HELP {name} Tunnels the kernel took over (entered), gave back to the relay (left: \
         a reload gave them a bandwidth limit, or the kernel refused a socket midway), or \
         could not take (refused).\n\
         # TYPE {name} counter\n"
    );
    for (event, n) in
        [("entered", &kernel::ENTERED), ("left", &kernel::LEFT), ("refused", &kernel::REFUSED)]
    {
        let _ = writeln!(out, "{name}{{event=\"{event}\"}} {}", n.load(Relaxed));
    }
}

/// The external authentication backends: whether each answers, and its answers.
fn auth_backend_metrics(out: &mut String, chain: &crate::policy::auth::backend::Chain) {
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering::Relaxed;
    if chain.is_empty() {
        return;
    }
    let help = "# HELP rustle_auth_backend_up Whether the backend answered its last call.\n\
                # TYPE rustle_auth_backend_up gauge\n";
    out.push_str(help);
    for s in chain.slots() {
        let _ = writeln!(
            out,
            "rustle_auth_backend_up{{backend=\"{}\"}} {}",
            s.common.name,
            u8::from(s.is_up())
        );
    }
    let name = "rustle_auth_backend_answers_total";
    let _ = write!(
        out,
        "# HELP {name} Answers of the backend (called, or remembered by a worker: cached).\n\
         # TYPE {name} counter\n"
    );
    for s in chain.slots() {
        let st = &s.stats;
        for (answer, n) in [
            ("allowed", &st.allowed),
            ("denied", &st.denied),
            ("unknown", &st.unknown),
            ("failed", &st.failed),
            ("cached", &st.cached),
        ] {
            let b = &s.common.name;
            let _ =
                writeln!(out, "{name}{{backend=\"{b}\",answer=\"{answer}\"}} {}", n.load(Relaxed));
        }
    }
    let name = "rustle_auth_accounting_records_total";
    let _ = write!(
        out,
        "# HELP {name} RADIUS accounting records sent, and those that got no response.\n\
         # TYPE {name} counter\n"
    );
    for s in chain.slots().filter(|s| s.interim.is_some()) {
        let b = &s.common.name;
        let sent = s.stats.acct_sent.load(Relaxed);
        let lost = s.stats.acct_failed.load(Relaxed);
        let _ = writeln!(out, "{name}{{backend=\"{b}\",outcome=\"sent\"}} {sent}");
        let _ = writeln!(out, "{name}{{backend=\"{b}\",outcome=\"lost\"}} {lost}");
    }
}

/// The fleet's shared state: whether Redis answers, what was sent to it.
fn state_metrics(out: &mut String, fleet: &crate::state::fleet::FleetHandle) {
    use std::fmt::Write as _;
    let status = fleet.status();
    let (up, _) = status.health();
    let counts = status.counts();
    for (name, kind, help, value) in [
        (
            "rustle_state_up",
            "gauge",
            "Whether the fleet's Redis answered the last call.",
            u64::from(up),
        ),
        (
            "rustle_state_commands_total",
            "counter",
            "Commands sent to the fleet's Redis.",
            counts.commands,
        ),
        (
            "rustle_state_bytes_sent_total",
            "counter",
            "Bytes of the commands sent to the fleet's Redis (before TLS).",
            counts.bytes,
        ),
        (
            "rustle_state_failures_total",
            "counter",
            "Calls to the fleet's Redis that failed (unreachable, timed out, refused).",
            counts.failures,
        ),
    ] {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n");
    }
}

/// Clock ticks per second in /proc's CPU times: `USER_HZ`, which Linux reports as 100 on
/// every architecture whatever its internal tick rate (as Prometheus's own procfs reader
/// assumes).
const USER_HZ: f64 = 100.0;

/// User plus system CPU time, from /proc/self/stat (fields 14 and 15, after the command
/// name in parentheses, which may itself hold spaces).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (the state): utime and stime are the 12th and 13th of it.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// The resident set size, from /proc/self/status (`VmRSS:  1234 kB`).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_eviction_fires_a_connections_receiver() {
        let waiting = Waiting::default();
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        let (first, mut evicted_first) = waiting.enter(peer);
        let (_, mut evicted_second) = waiting.enter(peer);
        // Its head in: out of the list, and its receiver says "no sender", which the
        // connection task's select does not take as an eviction.
        waiting.leave(first);
        assert_eq!(evicted_first.try_recv(), Err(oneshot::error::TryRecvError::Closed));
        assert_eq!(waiting.evict_oldest(), Some(peer));
        assert_eq!(evicted_second.try_recv(), Ok(()));
        assert_eq!(waiting.evict_oldest(), None);
    }
}
