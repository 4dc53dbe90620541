//! Workers and listeners. Each worker is a thread running a current-thread tokio runtime
//! with its own SO_REUSEPORT listening sockets, so the kernel spreads new connections over
//! the workers and a connection never leaves the thread that accepted it: no lock, no
//! atomic and no cross-thread wake-up on the request path.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use socket2::{Domain, Protocol, Socket as Socket2, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::accesslog::Sink;
use crate::buf::Buf;
use crate::config::{Config, Listener, ListenerKind};
use crate::conn::Stream;
use crate::limits::{parse_rate, Bucket, ConnLimits, Limit, Throttle, Traffic};
use crate::policy::Policy;
use crate::worker::Worker;

/// Pending connections per listening socket; the kernel caps it at somaxconn.
const BACKLOG: i32 = 4096;

/// After an accept error such as EMFILE, wait this long before accepting again instead
/// of spinning on a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How often a worker closes expired idle origin connections.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How long a reload waits for every worker to have the new policy in force before it says
/// so anyway (a worker takes it at its next turn of the housekeeping loop, within
/// microseconds unless its thread is starved; the wait only bounds a stuck worker).
const IN_FORCE_WITHIN: Duration = Duration::from_secs(5);

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
    s.set_tcp_nodelay(true)?;
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

/// The policy each worker has in force (by identity), so that a reload returns, and says
/// "reloaded", only once every worker has taken it.
struct InForce {
    taken: std::sync::Mutex<Vec<Option<Arc<Policy>>>>,
    changed: std::sync::Condvar,
}

impl InForce {
    fn new(workers: usize) -> Arc<InForce> {
        Arc::new(InForce {
            taken: std::sync::Mutex::new(vec![None; workers]),
            changed: std::sync::Condvar::new(),
        })
    }

    /// Worker `id` has `policy` in force.
    fn took(&self, id: usize, policy: Arc<Policy>) {
        // A poisoned lock only means another worker panicked while holding it: the slots
        // are still plain values.
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = taken.get_mut(id) {
            *slot = Some(policy);
        }
        self.changed.notify_all();
    }

    /// Waits up to `within` for every worker to have `policy` in force; the workers that
    /// have not by then.
    fn wait(&self, policy: &Arc<Policy>, within: Duration) -> Vec<usize> {
        let late = |taken: &Vec<Option<Arc<Policy>>>| -> Vec<usize> {
            let has = |p: &Option<Arc<Policy>>| p.as_ref().is_some_and(|p| Arc::ptr_eq(p, policy));
            taken.iter().enumerate().filter(|(_, p)| !has(p)).map(|(id, _)| id).collect()
        };
        let taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let (taken, _) = self
            .changed
            .wait_timeout_while(taken, within, |t| !late(t).is_empty())
            .unwrap_or_else(|p| p.into_inner());
        late(&taken)
    }
}

/// The bound addresses, for callers that asked for port 0.
pub struct Running {
    pub addrs: Vec<(ListenerKind, SocketAddr)>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: watch::Sender<bool>,
    policy_tx: watch::Sender<Arc<Policy>>,
    in_force: Arc<InForce>,
    switches: Arc<crate::relay::Switches>,
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

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy_tx.borrow().clone()
    }

    /// Puts `policy` in force in every worker, and returns once each has it (for new
    /// connections and requests), or after `IN_FORCE_WITHIN` with a warning naming the
    /// workers that have not taken it yet.
    pub fn publish(&self, policy: Policy) {
        let policy = Arc::new(policy);
        let _ = self.policy_tx.send(policy.clone());
        let late = self.in_force.wait(&policy, IN_FORCE_WITHIN);
        if !late.is_empty() {
            tracing::warn!(
                "worker(s) {late:?} have not taken the new policy after {IN_FORCE_WITHIN:?}; \
                 they will at their next turn"
            );
        }
    }

    /// Mode switches of this proxy's relays so far: (to splice, back to copy).
    pub fn mode_switches(&self) -> (u64, u64) {
        self.switches.get()
    }

    /// The proxy's own listening addresses (refused as destinations).
    pub fn own(&self) -> &[SocketAddr] {
        &self.own
    }

    /// The listeners as bound (ports resolved).
    pub fn listeners(&self) -> &[Arc<Listener>] {
        &self.listeners
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
    let in_force = InForce::new(sockets.len());
    let switches = Arc::new(crate::relay::Switches::default());
    let mut threads = Vec::new();
    for (id, socks) in sockets.drain(..).enumerate() {
        let cfg = cfg.clone();
        let (in_force, switches) = (in_force.clone(), switches.clone());
        let policy_rx = policy_rx.clone();
        let conn_limits = conn_limits.clone();
        let traffic = traffic.clone();
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
            crate::relay::count_switches_in(switches);
            let worker = Rc::new(Worker::new(
                id,
                cfg,
                policy_rx,
                shutdown,
                conn_limits,
                traffic,
                sink,
                open,
            ));
            in_force.took(id, worker.policy().as_ref().clone());
            local.block_on(&rt, worker_main(worker, socks, in_force));
        })?;
        threads.push(t);
    }
    for (kind, addr) in &addrs {
        tracing::info!("listening on {addr} ({kind}), {workers} worker(s)");
    }
    Ok(Running {
        addrs,
        threads,
        stop,
        policy_tx,
        in_force,
        switches,
        own,
        listeners: bound,
        traffic,
        sink,
    })
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

async fn worker_main(
    worker: Rc<Worker>,
    sockets: Vec<(Arc<Listener>, Socket)>,
    in_force: Arc<InForce>,
) {
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
    drop(tokio::task::spawn_local(crate::tunnel::park::serve_here()));
    if worker.id == 0 {
        drop(tokio::task::spawn_local(probe_parents(worker.clone())));
    }
    let mut shutdown = worker.shutdown.clone();
    let mut policy_rx = worker.policy_updates();
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
                    worker.trim_bufs(crate::tunnel::park::sweep(now));
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
                worker.set_policy(new.clone());
                in_force.took(worker.id, new);
            }
        }
    }
    // Draining: listeners stop on their own; wait for connections in flight. Idle
    // kept-alive connections are woken to close.
    worker.stopping.set(true);
    worker.waiters.sweep(Instant::now(), true);
    worker.upstreams.clear();
    let deadline = Instant::now() + worker.cfg.timeouts.shutdown;
    while worker.active() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        crate::idle::sweep_relays(Instant::now());
        crate::tunnel::park::sweep(Instant::now());
        worker.log.flush();
    }
    crate::tunnel::park::close_all();
    if worker.active() > 0 {
        tracing::warn!(
            "worker {}: {} connection(s) still open at the shutdown deadline; closing them",
            worker.id,
            worker.active()
        );
    }
    worker.log.flush();
}

/// Health probes of the parents that have one (`probe`, every `probe_every`), run by the
/// first worker for the whole process; the policy in force decides which, so a reload
/// adds and removes them.
async fn probe_parents(worker: Rc<Worker>) {
    let mut last: std::collections::HashMap<Box<str>, Instant> = Default::default();
    let mut shutdown = worker.shutdown.clone();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let policy = worker.policy();
        let now = Instant::now();
        for (i, p) in policy.routes.parents().iter().enumerate() {
            if p.probe.is_none() {
                continue;
            }
            let due = last.get(&p.name).is_none_or(|t| now.duration_since(*t) >= p.probe_every);
            if !due {
                continue;
            }
            last.insert(p.name.clone(), now);
            let (worker, policy) = (worker.clone(), policy.clone());
            drop(tokio::task::spawn_local(async move {
                let parent = &policy.routes.parents()[i];
                worker.upstreams.probe(&policy, parent, &worker.cfg.timeouts).await;
            }));
        }
        last.retain(|name, _| policy.routes.parents().iter().any(|p| p.name == *name));
    }
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
        let (guard, open, over_client) = worker.admit(peer.ip());
        let l = config.clone();
        let overloaded = open > worker.cfg.limits.max_connections || over_client;
        if config.kind == ListenerKind::Http {
            let stream = Stream::Fresh(Some(stream));
            if overloaded {
                tokio::task::spawn_local(crate::http1::refuse_overloaded(guard, l, stream, peer));
            } else {
                tokio::task::spawn_local(crate::dispatch::serve_fresh(guard, l, stream, peer));
            }
            continue;
        }
        if config.kind == ListenerKind::Auto && !overloaded {
            let stream = Stream::Fresh(Some(stream));
            tokio::task::spawn_local(crate::dispatch::serve_auto(guard, l, stream, peer));
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
                tokio::task::spawn_local(crate::dispatch::refuse_auto(guard, l, stream, peer));
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
                tokio::task::spawn_local(crate::dispatch::serve_https(guard, l, stream, peer));
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
