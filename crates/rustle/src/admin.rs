//! The admin endpoint (`[admin] listen`): Prometheus metrics at `/metrics`, `/healthz`
//! (the process answers) and `/readyz` (listeners bound, not draining), for scrapers, load
//! balancers and Kubernetes probes. It runs on a thread of its own with a small
//! current-thread runtime, so that a scrape never runs on a worker; it answers one request
//! per connection (HTTP/1.1, `Connection: close`), with a bounded head and a deadline.
//! `server` starts it; nothing below `server` imports it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::Admin;
use crate::metrics::{self, ListenerLabel, ParentView, Readiness, RouteView, WorkerStats};
use crate::policy::Policy;

/// The largest request head taken; a scraper's is a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;

/// How long a client has to send its request and take the answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; more wait in the kernel's backlog (a scraper or probe
/// needs one at a time).
const MAX_CONNECTIONS: usize = 64;

/// What the admin thread reads.
pub struct State {
    pub workers: Vec<Arc<WorkerStats>>,
    pub readiness: Arc<Readiness>,
    /// The listeners and the policy in force (a reload replaces them).
    pub view: watch::Receiver<Arc<View>>,
    /// True once a shutdown began: `/readyz` then says draining.
    pub shutdown: watch::Receiver<bool>,
}

/// What a scrape reports on that a reload changes.
pub struct View {
    /// The listeners bound, with their counters.
    pub listeners: Vec<ListenerLabel>,
    /// The policy in force, for the parents and their health.
    pub policy: Arc<Policy>,
}

/// The running admin endpoint.
pub struct Handle {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Handle {
    /// Stops answering (once the workers are done) and waits for the thread.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

/// Binds `cfg.listen` and starts the admin thread.
pub fn start(cfg: &Admin, listen: SocketAddr, state: State) -> anyhow::Result<Handle> {
    let listener = std::net::TcpListener::bind(listen)
        .with_context(|| format!("cannot listen on {listen} (admin)"))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = watch::channel(false);
    let server = Arc::new(Server {
        token: cfg.token.as_ref().map(|t| t.expose().as_bytes().to_vec()),
        allow: cfg.allow.clone(),
        max_user_series: cfg.max_user_series,
        started: Instant::now(),
        start_time: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default(),
        state,
    });
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
    tracing::info!("admin endpoint on http://{addr}/metrics (also /healthz, /readyz)");
    Ok(Handle { addr, stop, thread })
}

struct Server {
    token: Option<Vec<u8>>,
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
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p,
            _ = stop.changed() => return,
        };
        let Ok(permit) = permit else { return };
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("admin: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let server = server.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if tokio::time::timeout(REQUEST_TIMEOUT, answer(&server, stream, peer)).await.is_err() {
                tracing::debug!("admin: {peer}: timed out");
            }
        });
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
    fn text(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: "",
            content_type: "text/plain; charset=utf-8",
            body: format!("{body}\n"),
        }
    }
}

async fn answer(server: &Server, mut stream: TcpStream, peer: SocketAddr) {
    let mut buf = Vec::with_capacity(1024);
    let mut head_only = false;
    let reply = loop {
        let mut chunk = [0u8; 1024];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                head_only = req.method == Some("HEAD");
                break server.route(&req, peer.ip());
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                break Reply::text(431, "request head too large (at most 8 KiB)")
            }
            Err(e) => break Reply::text(400, &format!("malformed request: {e}")),
        }
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
    if stream.write_all(&out).await.is_ok() {
        let _ = stream.shutdown().await;
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

impl Server {
    fn route(&self, req: &httparse::Request<'_, '_>, client: IpAddr) -> Reply {
        if !self.allow.is_empty() && !self.allow.iter().any(|c| c.contains(client)) {
            return Reply::text(403, &format!("forbidden: {client} is not in [admin] allow"));
        }
        if let Some(token) = &self.token {
            let given = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                .and_then(|h| h.value.strip_prefix(b"Bearer "));
            let ok = given.is_some_and(|g| subtle::ConstantTimeEq::ct_eq(g, &token[..]).into());
            if !ok {
                let mut r = Reply::text(401, "unauthorized: send Authorization: Bearer TOKEN");
                r.headers = "WWW-Authenticate: Bearer realm=\"rustle admin\"\r\n";
                return r;
            }
        }
        let path = req.path.unwrap_or("/");
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
            return Reply::text(
                404,
                &format!("not found: {path} (try /metrics, /healthz, /readyz)"),
            );
        }
        if !matches!(req.method, Some("GET" | "HEAD")) {
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
                    Ok(()) => Reply::text(200, "ready"),
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
        metrics::render(&metrics::Scrape {
            listeners: &view.listeners,
            workers: &self.state.workers,
            max_user_series: self.max_user_series,
            parents: &parents,
            routes: &routes,
            process: &process,
        })
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
