//! Workers and listeners. Each worker is a thread running a current-thread tokio runtime
//! with its own SO_REUSEPORT listening sockets, so the kernel spreads new connections over
//! the workers and a connection never leaves the thread that accepted it: no lock, no
//! atomic and no cross-thread wake-up on the request path.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use socket2::{Domain, Protocol, Socket as Socket2, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::accesslog::{AccessLog, Sink};
use crate::auth::{CredentialCache, FailureLimiter};
use crate::buf::Buf;
use crate::config::{Config, Listener, ListenerKind};
use crate::conn::Stream;
use crate::limits::{parse_rate, Bucket, ConnLimits, Limit, Slot, Throttle, Traffic};
use crate::policy::Policy;
use crate::upstream::Upstreams;

/// Verified credentials a worker remembers.
const CRED_CACHE_MAX: usize = 10_000;

/// Client addresses whose failed attempts a worker tracks.
const FAILURE_TRACK_MAX: usize = 10_000;

/// Pending connections per listening socket; the kernel caps it at somaxconn.
const BACKLOG: i32 = 4096;

/// After an accept error such as EMFILE, wait this long before accepting again instead
/// of spinning on a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How often a worker closes expired idle origin connections.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What every connection task of one worker shares.
pub struct Worker {
    pub id: usize,
    pub cfg: Arc<Config>,
    pub upstreams: Upstreams,
    pub log: AccessLog,
    pub limits: rustle_proto::http::Limits,
    pub shutdown: watch::Receiver<bool>,
    /// Set once shutdown begins, read without touching the watch channel's lock.
    pub stopping: Cell<bool>,
    active: Cell<usize>,
    /// Users, rules and limits in force; replaced on SIGHUP. `Rc` so that a connection
    /// takes its snapshot without an atomic operation.
    // Rc over the shared Arc on purpose: cloning the Rc costs no atomic operation.
    #[allow(clippy::redundant_allocation)]
    policy: std::cell::RefCell<Rc<Arc<Policy>>>,
    policy_rx: watch::Receiver<Arc<Policy>>,
    /// Verified credentials (this worker's; no lock).
    creds: std::cell::RefCell<CredentialCache>,
    failures: std::cell::RefCell<FailureLimiter>,
    pub conn_limits: Arc<ConnLimits>,
    /// Bytes each way per authenticated user, across workers (for logs and metrics).
    pub traffic: Arc<Traffic>,
    /// Read buffers not in use, so a request does not allocate one.
    bufs: std::cell::RefCell<Vec<Buf>>,
    /// Response field lists not in use (see `take_fields`).
    fields: std::cell::RefCell<Vec<Vec<rustle_proto::http::Header>>>,
    /// The fewest spare buffers since the last trim: that many were not needed.
    bufs_low: Cell<usize>,
    /// When the allocator was last asked to give free pages back.
    released: Cell<Instant>,
    /// Tunnels parked since then.
    parked_untrimmed: Cell<usize>,
    /// Kept-alive connections waiting for their next request.
    pub waiters: crate::idle::Waiters,
    /// Open client connections across all workers, for `limits.max_connections`.
    open: Arc<AtomicUsize>,
}

/// Held by a connection task; releases its slot when the task ends however it ends.
pub struct ConnGuard {
    worker: Rc<Worker>,
    /// The connection's slots under the per-client and per-user limits; boxed, and only
    /// when a limit holds one, because every open connection and tunnel keeps its guard.
    slots: Option<Box<Slots>>,
}

#[derive(Default)]
struct Slots {
    /// This client address's slot under `limits.max_connections_per_client`.
    _client: Option<Slot>,
    /// The authenticated user's slot under `limits.max_connections_per_user`.
    user: Option<Slot>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.worker.active.set(self.worker.active.get() - 1);
        self.worker.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Each worker's sockets, with the listener each belongs to.
type WorkerSockets = Vec<(Arc<Listener>, Socket)>;

/// A listening socket of one worker.
pub enum Socket {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

impl Socket {
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Socket::Tcp(s) => s.local_addr(),
            Socket::Udp(s) => s.local_addr(),
        }
    }
}

/// Binds every configured listener once per worker. The first socket of a listener is
/// bound first, so that port 0 resolves to one port shared by all workers. An address
/// something else already serves is refused (`ensure_unused`).
fn bind_all(listeners: &[Listener], workers: usize) -> anyhow::Result<Vec<WorkerSockets>> {
    let mut per_worker: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
    for l in listeners {
        if l.listen.port() != 0 {
            ensure_unused(l.listen, l.kind == ListenerKind::UdpRelay)?;
        }
        let mut l = l.clone();
        for sockets in per_worker.iter_mut() {
            let addr = l.listen;
            let s = if l.kind == ListenerKind::UdpRelay {
                bind_udp(addr).map(Socket::Udp)
            } else {
                bind_one(addr, l.kind).map(Socket::Tcp)
            }
            .with_context(|| format!("cannot listen on {addr}"))?;
            l.listen = s.local_addr()?;
            sockets.push((Arc::new(l.clone()), s));
        }
    }
    Ok(per_worker)
}

/// Fails, naming the address, when a socket already listens on `addr` (TCP) or is bound
/// to it (UDP). The workers' sockets use SO_REUSEPORT, which would let them join those of
/// another rustle started on the same address (same user), the two then splitting the
/// traffic: so first a probe socket is bound there without SO_REUSEPORT, which the kernel
/// refuses (EADDRINUSE) while any socket serves the address, a SO_REUSEPORT group or a
/// wildcard listener covering it included. For TCP the probe has SO_REUSEADDR, so that
/// connections of an earlier run left in TIME_WAIT do not count. The probe is closed
/// before the real sockets are bound.
fn ensure_unused(addr: SocketAddr, udp: bool) -> anyhow::Result<()> {
    let probe = || -> std::io::Result<()> {
        let (ty, proto) = match udp {
            true => (Type::DGRAM, Protocol::UDP),
            false => (Type::STREAM, Protocol::TCP),
        };
        let s = Socket2::new(Domain::for_address(addr), ty, Some(proto))?;
        if !udp {
            s.set_reuse_address(true)?;
        }
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&addr.into())
    };
    match probe() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(anyhow::anyhow!(
            "cannot listen on {addr} ({}): the address is already in use, by another \
             process (another rustle?) or another listener of this configuration",
            if udp { "udp" } else { "tcp" }
        )),
        Err(e) => Err(e).with_context(|| format!("cannot listen on {addr}")),
    }
}

fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let s = Socket2::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // The kernel hashes each client address to one of the workers' sockets, so a
    // client's session stays on one worker.
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// How long an HTTP, HTTPS, SOCKS or auto listener lets the kernel hold a connection that
/// has sent nothing yet (TCP_DEFER_ACCEPT) before handing it over.
const DEFER_ACCEPT_SECS: u32 = 1;

fn bind_one(addr: SocketAddr, kind: ListenerKind) -> std::io::Result<std::net::TcpListener> {
    let s = Socket2::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux: one setsockopt
    // here instead of one per connection.
    s.set_nodelay(true)?;
    // A plain HTTP (or auto-detected) connection starts unregistered and reads at once
    // (`Stream::Fresh`): accepted only with its first bytes there, it is served without
    // waiting on epoll. SOCKS and TLS clients speak first too: their connections come with
    // their greeting or ClientHello, one wake-up instead of two. (A port relay does not
    // know who speaks first: no deferral there.)
    if matches!(
        kind,
        ListenerKind::Http | ListenerKind::Auto | ListenerKind::Socks | ListenerKind::Https
    ) {
        crate::sys::defer_accept(&s, DEFER_ACCEPT_SECS)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    Ok(s.into())
}

/// The bound addresses, for callers that asked for port 0.
pub struct Running {
    pub addrs: Vec<(ListenerKind, SocketAddr)>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: watch::Sender<bool>,
    policy_tx: watch::Sender<Arc<Policy>>,
    own: Vec<SocketAddr>,
    /// The listeners as bound (ports resolved), which a reload does not change.
    listeners: Vec<Arc<Listener>>,
    traffic: Arc<Traffic>,
    sink: Sink,
}

impl Running {
    /// Begins a graceful shutdown and waits for every worker to finish.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        self.join();
    }

    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Bytes each way per authenticated user so far: (user, up, down), sorted by user.
    pub fn traffic(&self) -> Vec<(String, u64, u64)> {
        self.traffic.snapshot()
    }

    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }

    /// Puts new users, rules, limits and certificates in force (SIGHUP). Listeners and
    /// everything else stay as they started; connections already open keep going. A
    /// configuration that would leave a running listener less protected than start-up
    /// allows changes nothing (`reload::vet`); the warnings name protections it drops.
    pub fn reload(&self, cfg: &Config) -> Result<Vec<String>, String> {
        let mut policy = Policy::build(cfg, &self.own).map_err(|p| p.join("; "))?;
        let old = self.policy_tx.borrow().clone();
        let mut warnings = crate::reload::vet(cfg, &self.listeners, &old, &policy)?;
        // (A listener requiring authentication left with no user: `vet` names it.)
        warnings.extend(policy.unknown_groups.iter().cloned());
        policy.keep_tls_of(&old);
        policy.routes.keep_health_of(&old.routes);
        let _ = self.policy_tx.send(Arc::new(policy));
        Ok(warnings)
    }

    /// Where the access log goes (SIGUSR1 reopens a file).
    pub fn access_log(&self) -> &Sink {
        &self.sink
    }
}

/// Binds the listeners and starts the workers; returns at once.
pub fn start(cfg: Config) -> anyhow::Result<Running> {
    let cfg = Arc::new(cfg);
    let workers = cfg.worker_count();
    let mut listeners = cfg.effective_listeners();
    for (i, l) in listeners.iter_mut().enumerate() {
        l.throttle = listener_throttle(l)?;
        l.index = i;
    }
    let mut sockets = bind_all(&listeners, workers)?;
    let mut addrs = Vec::new();
    let mut bound = Vec::new();
    if let Some(first) = sockets.first() {
        for (l, s) in first {
            addrs.push((l.kind, s.local_addr()?));
            bound.push(l.clone());
        }
    }
    let own: Vec<SocketAddr> = addrs.iter().map(|(_, a)| *a).collect();
    // Before the policy: TLS configs are built for kernel TLS when it is on.
    crate::tls::set_ktls(false);
    if listeners.iter().any(|l| l.tls.is_some() || l.target_tls.is_some()) {
        crate::tls::set_ktls(ktls_available(cfg.tls.ktls));
    }
    let policy = Policy::build(&cfg, &own).map_err(|p| anyhow::anyhow!(p.join("\n")))?;
    let problems = policy.startup_problems();
    if !problems.is_empty() {
        anyhow::bail!("{}", problems.join("\n"));
    }
    if policy.users.plain_count() > 0 {
        tracing::warn!(
            "{} user(s) have plaintext passwords; hash them with `rustle passwd NAME`",
            policy.users.plain_count()
        );
    }
    let (policy_tx, policy_rx) = watch::channel(Arc::new(policy));
    let conn_limits =
        ConnLimits::new(cfg.limits.max_connections_per_client, cfg.limits.max_connections_per_user);
    let traffic = Traffic::new();
    let sink = Sink::open(&cfg.log.access).context("cannot open the access log")?;
    let (stop, shutdown) = watch::channel(false);
    let open = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for (id, socks) in sockets.drain(..).enumerate() {
        let cfg = cfg.clone();
        let policy_rx = policy_rx.clone();
        let conn_limits = conn_limits.clone();
        let traffic = traffic.clone();
        let (auth_ttl, fail_burst, fail_rate) =
            (cfg.auth.cache_ttl, cfg.auth.failures_burst, cfg.auth.failures_per_minute);
        let sink = sink.clone();
        let shutdown = shutdown.clone();
        let open = open.clone();
        let t = std::thread::Builder::new().name(format!("rustle-w{id}")).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("worker {id}: cannot start a runtime: {e}");
                    return;
                }
            };
            let local = tokio::task::LocalSet::new();
            let log = AccessLog::new(sink, cfg.log.format);
            let limits = rustle_proto::http::Limits {
                max_head: cfg.limits.max_header_bytes,
                max_headers: cfg.limits.max_headers,
            };
            let initial_policy = policy_rx.borrow().clone();
            let worker = Rc::new(Worker {
                id,
                upstreams: Upstreams::new(cfg.upstream.clone()),
                cfg,
                log,
                limits,
                shutdown,
                stopping: Cell::new(false),
                active: Cell::new(0),
                bufs: std::cell::RefCell::new(Vec::new()),
                fields: std::cell::RefCell::new(Vec::new()),
                bufs_low: Cell::new(0),
                parked_untrimmed: Cell::new(0),
                released: Cell::new(
                    Instant::now().checked_sub(RELEASE_EVERY).unwrap_or_else(Instant::now),
                ),
                waiters: Default::default(),
                policy: std::cell::RefCell::new(Rc::new(initial_policy)),
                creds: std::cell::RefCell::new(CredentialCache::new(auth_ttl, CRED_CACHE_MAX)),
                failures: std::cell::RefCell::new(FailureLimiter::new(
                    fail_burst,
                    fail_rate,
                    FAILURE_TRACK_MAX,
                )),
                policy_rx,
                conn_limits,
                traffic,
                open,
            });
            local.block_on(&rt, worker_main(worker, socks));
        })?;
        threads.push(t);
    }
    for (kind, addr) in &addrs {
        tracing::info!("listening on {addr} ({kind}), {workers} worker(s)");
    }
    Ok(Running { addrs, threads, stop, policy_tx, own, listeners: bound, traffic, sink })
}

/// Descriptors the proxy holds besides its connections: standard streams, the event
/// loops and their wake-ups, listening sockets, the access log, DNS lookups.
const SPARE_FILES: u64 = 64;

/// Raises the soft open-file limit to the hard one (service managers usually leave the
/// soft limit at 1024: about 500 proxied connections), and warns, with the figures, when
/// even the hard limit is below what `limits.max_connections` needs: a proxied connection
/// holds two descriptors (client and upstream), four more while splicing (two pipes).
/// Past the limit, accepting pauses (see `AcceptFailures`) and connecting upstream fails.
pub fn raise_file_limit(cfg: &Config) {
    use rlimit::Resource;
    let (soft, hard) = match Resource::NOFILE.get() {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!("cannot read the open-file limit: {e}");
            return;
        }
    };
    // An unlimited hard limit still stops at the kernel's per-process ceiling.
    let target = match hard {
        rlimit::INFINITY => std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(1 << 20),
        hard => hard,
    };
    let mut limit = soft;
    if soft < target {
        match Resource::NOFILE.set(target, hard) {
            Ok(()) => {
                limit = target;
                tracing::info!("open-file limit raised from {soft} to {target} (the hard limit)");
            }
            Err(e) => {
                tracing::warn!("cannot raise the open-file limit from {soft} to {target}: {e}")
            }
        }
    }
    let listening = cfg.effective_listeners().len() * cfg.worker_count();
    let connections = cfg.limits.max_connections;
    let need = u64::try_from(connections)
        .unwrap_or(u64::MAX)
        .saturating_mul(2)
        .saturating_add(u64::try_from(listening).unwrap_or(u64::MAX))
        .saturating_add(SPARE_FILES);
    if limit < need {
        tracing::warn!(
            "open-file limit {limit} (hard limit {hard}) is below the {need} that \
             limits.max_connections = {connections} needs (2 per proxied connection, more while \
             splicing): raise it (systemd LimitNOFILE=, ulimit -Hn) or lower max_connections"
        );
    }
}

/// Kernel TLS: probed and said once at start. Where the kernel has the `tls` module,
/// finished handshakes hand their keys to it (the `ktls` crate); elsewhere TLS runs in
/// user space (rustls).
fn ktls_available(mode: crate::config::Ktls) -> bool {
    if mode == crate::config::Ktls::Off {
        return false;
    }
    match crate::sys::ktls_probe() {
        Ok(()) => {
            tracing::info!(
                "kernel TLS is available: sessions go to the kernel after the handshake"
            );
            true
        }
        Err(e) => {
            tracing::info!(
                "kernel TLS is not available here ({e}: the kernel's `tls` module is missing); \
                 TLS runs in user space (rustls)"
            );
            false
        }
    }
}

/// The buckets of a listener's own bandwidth limit.
fn listener_throttle(l: &Listener) -> anyhow::Result<Throttle> {
    let make = |r: &Option<String>| -> anyhow::Result<Option<Arc<Bucket>>> {
        Ok(match r {
            Some(r) => {
                let rate =
                    parse_rate(r).map_err(|e| anyhow::anyhow!("listener {}: {e}", l.listen))?;
                Some(Arc::new(Bucket::new(rate, Bucket::default_burst(rate))))
            }
            None => None,
        })
    };
    Ok(Throttle {
        up: Limit { user: None, listener: make(&l.rate_up)? },
        down: Limit { user: None, listener: make(&l.rate_down)? },
    })
}

async fn worker_main(worker: Rc<Worker>, sockets: Vec<(Arc<Listener>, Socket)>) {
    for (l, s) in sockets {
        let started = match s {
            Socket::Tcp(s) => crate::sys::watch_listener(s)
                .map(|s| drop(tokio::task::spawn_local(accept_loop(worker.clone(), l, s)))),
            Socket::Udp(s) => tokio::net::UdpSocket::from_std(s).map(|s| {
                drop(tokio::task::spawn_local(crate::udp::serve_relay(worker.clone(), l, s)))
            }),
        };
        if let Err(e) = started {
            tracing::error!("worker {}: cannot use a listener: {e}", worker.id);
        }
    }
    // Housekeeping: flush the access log, close expired idle origin connections, end
    // idle tunnels (their deadlines are swept here rather than timed one by one).
    crate::idle::sweep_relays_here();
    drop(tokio::task::spawn_local(crate::park::serve_here()));
    let mut shutdown = worker.shutdown.clone();
    let mut policy_rx = worker.policy_rx.clone();
    // One tick flushes the access log (a line waits in a worker's buffer no longer) and
    // sweeps the waits.
    let mut flush = tokio::time::interval(crate::idle::TICK);
    let mut last_sweep = Instant::now();
    loop {
        tokio::select! {
            _ = flush.tick() => {
                worker.log.flush();
                let now = Instant::now();
                worker.waiters.sweep(now, false);
                crate::idle::sweep_relays(now);
                if last_sweep.elapsed() >= SWEEP_EVERY {
                    worker.upstreams.sweep();
                    worker.trim_bufs(crate::park::sweep(now));
                    last_sweep = Instant::now();
                }
            }
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            Ok(()) = policy_rx.changed() => {
                let new = policy_rx.borrow_and_update().clone();
                *worker.policy.borrow_mut() = Rc::new(new);
            }
        }
    }
    // Draining: listeners stop on their own; wait for connections in flight. Idle
    // kept-alive connections are woken to close.
    worker.stopping.set(true);
    worker.waiters.sweep(Instant::now(), true);
    worker.upstreams.clear();
    let deadline = Instant::now() + worker.cfg.timeouts.shutdown;
    while worker.active.get() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        crate::idle::sweep_relays(Instant::now());
        crate::park::sweep(Instant::now());
        worker.log.flush();
    }
    crate::park::close_all();
    if worker.active.get() > 0 {
        tracing::warn!(
            "worker {}: {} connection(s) still open at the shutdown deadline; closing them",
            worker.id,
            worker.active.get()
        );
    }
    worker.log.flush();
}

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
async fn accept_loop(
    worker: Rc<Worker>,
    config: Arc<Listener>,
    listener: AsyncFd<std::net::TcpListener>,
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
        let open = worker.open.fetch_add(1, Ordering::Relaxed) + 1;
        worker.active.set(worker.active.get() + 1);
        let client_slot = worker.conn_limits.acquire_client(peer.ip());
        let over_client = client_slot.is_none();
        let guard = ConnGuard {
            worker: worker.clone(),
            slots: client_slot
                .filter(Slot::counts)
                .map(|c| Box::new(Slots { _client: Some(c), user: None })),
        };
        let l = config.clone();
        let overloaded = open > worker.cfg.limits.max_connections || over_client;
        if config.kind == ListenerKind::Http {
            let stream = Stream::Fresh(Some(stream));
            if overloaded {
                tokio::task::spawn_local(crate::http1::refuse_overloaded(guard, l, stream, peer));
            } else {
                tokio::task::spawn_local(crate::http1::serve(guard, l, stream, peer));
            }
            continue;
        }
        if config.kind == ListenerKind::Auto && !overloaded {
            let stream = Stream::Fresh(Some(stream));
            tokio::task::spawn_local(crate::socks::serve_auto(guard, l, stream, peer));
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
                tokio::task::spawn_local(crate::socks::refuse_auto(guard, l, stream, peer));
            } else {
                tracing::warn!("{peer}: refused, {open} connections open");
            }
            continue;
        }
        match config.kind {
            ListenerKind::Http => {}
            ListenerKind::Socks => {
                tokio::task::spawn_local(crate::socks::serve(
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
                tokio::task::spawn_local(crate::portmap::serve(guard, l, stream, peer));
            }
            ListenerKind::Https => {
                tokio::task::spawn_local(crate::https::serve(guard, l, stream, peer));
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

/// Spare buffers a worker may keep; beyond this, returned buffers are freed. Idle
/// kept-alive connections give their buffer back between requests, so a busy worker
/// needs about one per active connection: a small cap made them allocate (and zero
/// 16 KiB) on most requests. What the last second did not use is freed by `trim_bufs`.
const MAX_SPARE_BUFS: usize = 4096;

/// Least time between two hand-backs of free memory to the kernel (`trim_bufs`).
const RELEASE_EVERY: Duration = Duration::from_secs(10);

/// Spare response field lists a worker keeps, and the largest it keeps (in fields).
const MAX_SPARE_FIELDS: usize = 256;
const MAX_KEPT_FIELDS: usize = 64;

/// Tunnels parked since the allocator last gave pages back that make it worth doing again.
const PARKED_TO_RELEASE: usize = 256;

impl Worker {
    /// When an exchange starts, for its log line: the clock when lines are written,
    /// the last sweep's time when they are not (nothing reads it then).
    pub fn stamp(&self) -> Instant {
        match self.log.enabled() {
            true => Instant::now(),
            false => self.waiters.coarse_now(),
        }
    }

    /// The generation of the users in force (changes with every reload).
    pub fn users_generation(&self) -> u64 {
        self.policy.borrow().users.generation()
    }

    /// The policy in force, for one request or handshake.
    pub fn policy(&self) -> Rc<Arc<Policy>> {
        self.policy.borrow().clone()
    }

    /// Checks a user name and password: the verified-credentials cache first, then the
    /// (deliberately slow) hash, off the event loop. Failed attempts are limited per
    /// client address.
    pub async fn authenticate(
        &self,
        client: std::net::IpAddr,
        user: &str,
        password: &[u8],
    ) -> Result<(), crate::error::Error> {
        use crate::error::Error;
        let now = Instant::now();
        if !self.failures.borrow_mut().allowed(client, now) {
            return Err(Error::AuthRateLimited);
        }
        let policy = self.policy();
        let generation = policy.users.generation();
        if self.creds.borrow_mut().lookup(user, password, generation) {
            return Ok(());
        }
        // An unknown user costs the same hash as a known one, so that timing does not
        // tell which names exist.
        let (u, known) = match policy.users.get(user) {
            Some(u) => (Some(u.clone()), true),
            None => (policy.users.decoy().or_else(crate::auth::decoy_user), false),
        };
        let Some(u) = u else {
            self.failures.borrow_mut().record_failure(client, now);
            return Err(Error::AuthRequired("unknown user or wrong password"));
        };
        let pw = password.to_vec();
        let ok = tokio::task::spawn_blocking(move || u.verify(&pw)).await.unwrap_or(false);
        if ok && known {
            self.creds.borrow_mut().insert(user, password, generation);
            Ok(())
        } else {
            self.failures.borrow_mut().record_failure(client, Instant::now());
            Err(Error::AuthRequired("unknown user or wrong password"))
        }
    }

    /// Relay settings for a tunnel accepted on a listener with this splice mode.
    pub fn relay_opts(&self, splice: crate::config::SpliceMode) -> crate::relay::Opts {
        let r = &self.cfg.relay;
        crate::relay::Opts {
            idle: self.cfg.timeouts.tunnel_idle,
            splice,
            grace: (r.grace_reads > 0)
                .then_some(crate::relay::Grace { reads: r.grace_reads, delay: r.grace_delay }),
        }
    }

    /// A response head's field list from the worker's spares (a fresh one when there is
    /// none): parsing a response then allocates nothing, and an idle connection keeps none.
    pub fn take_fields(&self) -> Vec<rustle_proto::http::Header> {
        self.fields.borrow_mut().pop().unwrap_or_default()
    }

    pub fn give_fields(&self, mut fields: Vec<rustle_proto::http::Header>) {
        let mut spare = self.fields.borrow_mut();
        if spare.len() < MAX_SPARE_FIELDS && fields.capacity() <= MAX_KEPT_FIELDS {
            fields.clear();
            spare.push(fields);
        }
    }

    pub fn take_buf(&self) -> Buf {
        let mut bufs = self.bufs.borrow_mut();
        let buf = bufs.pop().unwrap_or_else(Buf::with_storage);
        self.bufs_low.set(self.bufs_low.get().min(bufs.len()));
        buf
    }

    /// Frees the spare buffers that went unused since the last trim (run every second),
    /// so the pool follows the load down; when that freed a burst's worth (256 KiB or
    /// more), or when `parked` (since the last call) adds up to many parked tunnels, whose
    /// tasks were freed, the allocator is asked to give its free pages back, so that RSS
    /// follows too.
    fn trim_bufs(&self, parked: usize) {
        let mut bufs = self.bufs.borrow_mut();
        let unused = self.bufs_low.get().min(bufs.len());
        let keep = bufs.len() - unused;
        bufs.truncate(keep);
        bufs.shrink_to(keep.max(16));
        self.bufs_low.set(bufs.len());
        drop(bufs);
        // At most every 10 s: a load that swings would otherwise give pages back and fault
        // them in again every second, and glibc's trim walks every arena. Parked tunnels
        // count once there are many (each freed about a kilobyte): a burst of them is
        // given back within a second or two, a trickle of parking waits.
        let now = Instant::now();
        let since = now.duration_since(self.released.get());
        let parked = self.parked_untrimmed.get() + parked;
        if (unused >= 16 && since >= RELEASE_EVERY)
            || (parked >= PARKED_TO_RELEASE && since >= Duration::from_secs(1))
        {
            self.released.set(now);
            self.parked_untrimmed.set(0);
            crate::sys::release_free_memory();
        } else {
            self.parked_untrimmed.set(parked);
        }
    }

    pub fn give_buf(&self, mut buf: Buf) {
        let mut bufs = self.bufs.borrow_mut();
        if bufs.len() < MAX_SPARE_BUFS && buf.capacity() == crate::buf::READ_SIZE {
            buf.clear();
            bufs.push(buf);
        }
    }
}

impl ConnGuard {
    pub fn worker(&self) -> &Rc<Worker> {
        &self.worker
    }

    /// Counts this connection against `user`'s limit (once per connection); false when
    /// the user is at its limit.
    pub fn hold_user(&mut self, user: &str) -> bool {
        if self.slots.as_ref().is_some_and(|s| s.user.is_some()) {
            return true;
        }
        match self.worker.conn_limits.acquire_user(user) {
            Some(slot) => {
                if slot.counts() {
                    self.slots.get_or_insert_with(Box::default).user = Some(slot);
                }
                true
            }
            None => false,
        }
    }
}

/// Runs until SIGINT or SIGTERM. SIGHUP derives the configuration from `source` again
/// and puts its policy in force; SIGUSR1 reopens the access log. `loaded` is what
/// `source` gave at start.
pub fn run_until_signal(
    loaded: crate::config::Loaded,
    source: crate::config::Source,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The handlers are in place before the listeners say where they are, so that a
    // signal sent as soon as they do never meets its default action (which ends the
    // process for SIGHUP and SIGUSR1).
    let (mut term, mut int, mut hup, mut usr1) = {
        let _in = rt.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
            signal(SignalKind::hangup())?,
            signal(SignalKind::user_defined1())?,
        )
    };
    let running = start(loaded.config)?;
    let from_file = loaded.listeners_from_file;
    let stop = running.stopper();
    rt.block_on(async {
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: draining connections"); break }
                _ = int.recv() => { tracing::info!("SIGINT: draining connections"); break }
                _ = hup.recv() => crate::reload::hangup(&running, &source, from_file),
                _ = usr1.recv() => crate::reload::reopen_access_log(&running),
            }
        }
    });
    let _ = stop.send(true);
    running.join();
    tracing::info!("stopped");
    Ok(())
}
