//! Workers and listeners. Each worker is a thread running a current-thread tokio runtime
//! with its own SO_REUSEPORT listening sockets, so the kernel spreads new connections over
//! the workers and a connection never leaves the thread that accepted it: no lock, no
//! atomic and no cross-thread wake-up on the request path. The main thread keeps a copy
//! of every listening socket (`bind`): a reload binds, keeps or closes listeners and tells
//! each worker over its own channel (`Update`); a takeover hands the sockets to the new
//! process.

mod bind;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

pub use self::bind::{ensure_unused, Bound, Group, Inherited, Socket};
use crate::accesslog::Sink;
use crate::buf::Buf;
use crate::config::{Config, ListenerKey, ListenerKind};
use crate::conn::Stream;
use crate::limits::{ConnLimits, Traffic};
use crate::policy::Listener;
use crate::policy::Policy;
use crate::worker::Worker;

/// After an accept error such as EMFILE, wait this long before accepting again instead
/// of spinning on a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// In a drain, how long a kept-alive connection idle between requests has to send its next
/// one (answered with `Connection: close`) before it is closed. A client in the middle of
/// a series of requests sends its next within milliseconds; a client's idle pool (a
/// browser's) should not hold the process for the whole drain, nor a shutdown with no work
/// in flight last long. Closing an idle connection is then no more abrupt than its
/// keep-alive timeout.
const DRAIN_IDLE_GRACE: Duration = Duration::from_millis(500);

/// At the end of a drain, how long idle kept-alive connections, woken to close, have to
/// do so (a TLS one sends close_notify) before the rest are dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_millis(100);

/// How often a worker closes expired idle origin connections.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How long a reload waits for every worker to have the new policy in force before it says
/// so anyway (a worker takes it at its next turn of its loop, within microseconds unless
/// its thread is starved; the wait only bounds a stuck worker).
const IN_FORCE_WITHIN: Duration = Duration::from_secs(5);

/// The policy each worker has in force (by identity), so that a reload returns, and says
/// "reloaded", only once every worker has taken it.
struct InForce {
    taken: Mutex<Vec<Option<Arc<Policy>>>>,
    changed: std::sync::Condvar,
}

impl InForce {
    fn new(workers: usize) -> Arc<InForce> {
        Arc::new(InForce { taken: Mutex::new(vec![None; workers]), changed: Default::default() })
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

/// What a worker is told to put in force: at start, on a reload, and when a takeover
/// asks it to stop accepting (no listener).
pub struct Update {
    policy: Arc<Policy>,
    sink: Sink,
    /// The worker's listeners from now on: their settings, and the worker's descriptors
    /// of a listener's sockets when it is new to the worker (None: keep those it has for
    /// that key). A listener not named stops accepting.
    listeners: Vec<(Arc<Listener>, Option<Vec<Socket>>)>,
}

/// A running proxy: its workers, and what the main thread keeps to reload or hand over.
pub struct Running {
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: watch::Sender<bool>,
    workers: Vec<mpsc::UnboundedSender<Update>>,
    state: Mutex<State>,
    traffic: Arc<Traffic>,
    conn_limits: Arc<ConnLimits>,
    in_force: Arc<InForce>,
    switches: Arc<crate::relay::Switches>,
    /// Each worker's first listeners, until `serve` sends them.
    first: Mutex<Vec<Update>>,
    /// Whether the proxy takes new connections (`/readyz`).
    readiness: Arc<crate::metrics::Readiness>,
    /// The admin endpoint, when `[admin] listen` is set, and what its scrapes read.
    admin: Option<crate::admin::Handle>,
    admin_view: watch::Sender<Arc<crate::admin::View>>,
}

/// What a reload replaces.
struct State {
    /// The listeners in configuration order, with the main thread's copy of their sockets.
    bound: Vec<Bound>,
    policy: Arc<Policy>,
    /// The configuration in force, as derived (listeners as configured, port 0 included).
    config: Arc<Config>,
    sink: Sink,
}

/// A reload made ready but not yet in force: new listeners bound, the access log opened.
/// Dropping it closes what it opened and changes nothing.
pub struct Plan {
    listeners: Vec<Planned>,
    /// Listeners of the running set that the new configuration drops (by position).
    removed: Vec<usize>,
    sink: Sink,
    config: Arc<Config>,
    /// Settings changed that only a restart or a takeover puts in force.
    pub warnings: Vec<String>,
    /// The admin endpoint's address (it stays as it is until the next start).
    admin: Option<SocketAddr>,
}

enum Planned {
    /// A running listener (by position) kept with its sockets and these settings.
    Kept(usize, Arc<Listener>),
    Fresh(Bound),
}

impl Plan {
    /// The listeners the reload would run, as bound.
    pub fn listeners(&self) -> Vec<Arc<Listener>> {
        self.listeners
            .iter()
            .map(|p| match p {
                Planned::Kept(_, l) => l.clone(),
                Planned::Fresh(b) => b.listener.clone(),
            })
            .collect()
    }

    /// Their addresses and the admin endpoint's (refused as destinations).
    pub fn own(&self) -> Vec<SocketAddr> {
        self.listeners().iter().map(|l| l.listen).chain(self.admin).collect()
    }
}

impl Running {
    /// Begins a graceful shutdown and waits for every worker to finish.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        self.join();
    }

    /// Waits for every worker to finish (after `stop`, or the stopper's signal). The main
    /// thread's copies of the listening sockets close first, so that once the workers
    /// closed theirs the ports refuse new connections (unless a process that took them
    /// over holds them).
    pub fn join(self) {
        self.state().bound.clear();
        for t in self.threads {
            let _ = t.join();
        }
        // Answers (`/readyz`: draining) until the last worker is done.
        if let Some(admin) = self.admin {
            admin.stop();
        }
    }

    /// The admin endpoint's address, when there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.addr)
    }

    /// Whether the proxy takes new connections, as `/readyz` says: ready once bound,
    /// draining once a shutdown begins (a takeover may say so too).
    pub fn readiness(&self) -> &Arc<crate::metrics::Readiness> {
        &self.readiness
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        self.state().policy.clone()
    }

    /// The configuration in force, as derived (listeners as configured).
    pub fn config(&self) -> Arc<Config> {
        self.state().config.clone()
    }

    /// Every listener's kind and bound address, in configuration order.
    pub fn addrs(&self) -> Vec<(ListenerKind, SocketAddr)> {
        self.state().bound.iter().map(|b| (b.listener.kind, b.listener.listen)).collect()
    }

    /// The proxy's own listening addresses, the admin endpoint's too (refused as
    /// destinations).
    pub fn own(&self) -> Vec<SocketAddr> {
        let listeners = self.state().bound.iter().map(|b| b.listener.listen).collect::<Vec<_>>();
        listeners.into_iter().chain(self.admin_addr()).collect()
    }

    /// The listeners as bound (ports resolved).
    pub fn listeners(&self) -> Vec<Arc<Listener>> {
        self.state().bound.iter().map(|b| b.listener.clone()).collect()
    }

    /// Where the access log goes (SIGUSR1 reopens a file).
    pub fn access_log(&self) -> Sink {
        self.state().sink.clone()
    }

    /// Everything a reload to `cfg` needs that can fail, without changing anything in
    /// force: listeners the running set lacks are bound (a failure, such as an address
    /// in use, fails the whole reload), the others matched to running ones by their key
    /// (their sockets stay, so the port never refuses a connection), a new access-log
    /// target opened.
    pub fn prepare(&self, cfg: &Config) -> Result<Plan, String> {
        let state = self.state();
        let old = &state.config;
        let workers = self.workers.len();
        let mut warnings = Vec::new();
        if cfg.worker_count() != workers {
            warnings.push(format!(
                "workers = {} takes effect at the next start (or takeover); {workers} run",
                cfg.worker_count()
            ));
        }
        if cfg.process != old.process {
            warnings.push("[process] takes effect at the next start (or takeover)".to_string());
        }
        if cfg.admin != old.admin {
            warnings.push("[admin] takes effect at the next start (or takeover)".to_string());
        }
        if cfg.tls.ktls != old.tls.ktls {
            warnings.push("tls.ktls takes effect at the next start (or takeover)".to_string());
        }
        if cfg.auth.hash_threads != old.auth.hash_threads {
            warnings
                .push("auth.hash_threads takes effect at the next start (or takeover)".to_string());
        }
        let mut listeners = Vec::new();
        let mut kept = vec![false; state.bound.len()];
        let mut inherited = Inherited::default();
        for mut l in cfg.effective_listeners() {
            let running = state.bound.iter().position(|b| b.listener.key == l.key);
            let Some(i) = running else {
                let l = Listener::new(l, workers)?;
                let bound =
                    bind::bind(&l, workers, &mut inherited).map_err(|e| format!("{e:#}"))?;
                listeners.push(Planned::Fresh(bound));
                continue;
            };
            kept[i] = true;
            let was = &state.bound[i].listener;
            l.listen = was.listen;
            listeners.push(Planned::Kept(i, Arc::new(Listener::succeeding(l, was)?)));
        }
        let removed = (0..kept.len()).filter(|&i| !kept[i]).collect();
        let (new_log, old_log) = (&cfg.log, &old.log);
        let same_sink = new_log.access == old_log.access
            && new_log.syslog_format == old_log.syslog_format
            && new_log.syslog_facility == old_log.syslog_facility
            && new_log.tag == old_log.tag;
        let sink = match same_sink {
            true => state.sink.clone(),
            false => Sink::open(&cfg.log).map_err(|e| e.to_string())?,
        };
        // A reload reads the host's addresses again (refused with `deny_private_destinations`,
        // and reaching listeners on an unspecified address).
        crate::acl::local::refresh();
        let admin = self.admin_addr();
        Ok(Plan { listeners, removed, sink, config: Arc::new(cfg.clone()), warnings, admin })
    }

    /// Puts a prepared reload in force: every worker gets the new policy and
    /// configuration and its new listener set; listeners dropped stop accepting
    /// (connections in flight go on), new ones start.
    pub fn commit(&self, plan: Plan, policy: Policy) {
        let policy = Arc::new(policy);
        let cfg = &plan.config;
        self.conn_limits
            .set_limits(cfg.limits.max_connections_per_client, cfg.limits.max_connections_per_user);
        let mut state = self.state();
        let mut old: Vec<Option<Bound>> = state.bound.drain(..).map(Some).collect();
        let mut bound = Vec::new();
        let mut fresh = Vec::new();
        for p in plan.listeners {
            match p {
                Planned::Kept(i, l) => {
                    let Some(mut b) = old[i].take() else { continue };
                    if b.listener.kind != l.kind {
                        if let Err(e) = b.set_kind(l.kind) {
                            tracing::warn!("listener {}: {e}", l.listen);
                        }
                    }
                    b.listener = l;
                    bound.push(b);
                }
                Planned::Fresh(b) => {
                    fresh.push(b.listener.key);
                    bound.push(b);
                }
            }
        }
        for i in plan.removed {
            if let Some(b) = old[i].take() {
                let l = &b.listener;
                tracing::info!(
                    "closed the listener on {} ({}): not in the configuration",
                    l.listen,
                    l.kind
                );
            }
        }
        let workers = self.workers.len();
        for (id, tx) in self.workers.iter().enumerate() {
            let listeners = bound
                .iter()
                .map(|b| {
                    let sockets = match fresh.contains(&b.listener.key) {
                        true => Some(b.for_worker(id, workers).unwrap_or_else(|e| {
                            tracing::error!("worker {id}: listener {}: {e}", b.listener.listen);
                            Vec::new()
                        })),
                        false => None,
                    };
                    (b.listener.clone(), sockets)
                })
                .collect();
            let update = Update { policy: policy.clone(), sink: plan.sink.clone(), listeners };
            let _ = tx.send(update);
        }
        for b in bound.iter().filter(|b| fresh.contains(&b.listener.key)) {
            let l = &b.listener;
            tracing::info!("listening on {} ({}), {workers} worker(s)", l.listen, l.kind);
        }
        // The main thread's copies of dropped listeners close here; the workers close
        // theirs as they take the update.
        drop(old);
        let _ = self.admin_view.send(admin_view(&bound, &policy));
        *state = State { bound, policy: policy.clone(), config: plan.config, sink: plan.sink };
        drop(state);
        let late = self.in_force.wait(&policy, IN_FORCE_WITHIN);
        if !late.is_empty() {
            tracing::warn!(
                "worker(s) {late:?} have not taken the new configuration after \
                 {IN_FORCE_WITHIN:?}; they will at their next turn"
            );
        }
    }

    /// Mode switches of this proxy's relays so far: (to splice, back to copy).
    pub fn mode_switches(&self) -> (u64, u64) {
        self.switches.get()
    }

    /// The workers begin accepting (`start_with` leaves them idle), and `/readyz` says
    /// ready. Once only; later calls do nothing.
    pub fn serve(&self) {
        let first = std::mem::take(&mut *self.first.lock().unwrap_or_else(|p| p.into_inner()));
        for (tx, update) in self.workers.iter().zip(first) {
            let _ = tx.send(update);
        }
        self.readiness.set_ready();
    }

    /// Logs where each listener listens (`start_with` leaves it to the caller, which
    /// may first give root up: the lines tell that the proxy is ready).
    pub fn announce(&self) {
        let workers = self.workers.len();
        for b in &self.state().bound {
            let l = &b.listener;
            tracing::info!("listening on {} ({}), {workers} worker(s)", l.listen, l.kind);
        }
    }

    /// Every worker stops accepting (a takeover: the new process accepts on the same
    /// sockets); connections in flight go on. The main thread keeps its copies until it
    /// exits.
    pub fn stop_accepting(&self) {
        self.readiness.set_draining();
        let state = self.state();
        for tx in &self.workers {
            let update = Update {
                policy: state.policy.clone(),
                sink: state.sink.clone(),
                listeners: vec![],
            };
            let _ = tx.send(update);
        }
    }

    /// The listeners' sockets, each listener's as a group, to hand to a new process.
    pub fn with_sockets<T>(&self, f: impl FnOnce(&[Bound]) -> T) -> T {
        f(&self.state().bound)
    }

    /// The admin endpoint's listening socket and the address configured for it, to hand
    /// to a new process.
    pub fn admin_socket(&self) -> Option<(SocketAddr, std::os::fd::BorrowedFd<'_>)> {
        self.admin.as_ref().map(|a| (a.configured, a.socket()))
    }

    /// The admin endpoint stops accepting (a takeover: the new process answers on the
    /// same socket); answers under way finish.
    pub fn release_admin(&self) {
        if let Some(admin) = &self.admin {
            admin.stop_accepting();
        }
    }
}

/// Binds the listeners and starts the workers; returns at once.
pub fn start(cfg: Config) -> anyhow::Result<Running> {
    let running = start_with(cfg, Inherited::default())?;
    running.serve();
    running.announce();
    Ok(running)
}

/// `start`, taking listening sockets from `inherited` for the listeners they match (a
/// takeover, socket activation) and binding the others, without the `announce` lines.
/// The workers accept nothing until `serve`, so that a caller can give root up first.
/// Inherited sockets no listener wants are closed.
pub fn start_with(cfg: Config, mut inherited: Inherited) -> anyhow::Result<Running> {
    let config = Arc::new(cfg.clone());
    let workers = cfg.worker_count();
    crate::metrics::set_workers(workers);
    let mut bound = Vec::new();
    for l in cfg.effective_listeners() {
        let l = Listener::new(l, workers).map_err(anyhow::Error::msg)?;
        bound.push(bind::bind(&l, workers, &mut inherited)?);
    }
    let admin_socket = inherited.take_admin(cfg.admin.listen);
    for g in &inherited.groups {
        let what = if g.udp { "udp" } else { "tcp" };
        tracing::info!(
            "{} inherited socket(s) on {} ({what}): no listener of this configuration; closed",
            g.sockets.len(),
            g.addr
        );
    }
    drop(inherited);
    // The admin endpoint's socket is bound before the policy, which refuses it as a
    // destination with every listener's.
    let admin_listener = match (cfg.admin.listen, admin_socket) {
        (Some(listen), Some(socket)) => Some((listen, socket)),
        (Some(listen), None) => Some((listen, crate::admin::bind(listen)?)),
        (None, _) => None,
    };
    let mut own: Vec<SocketAddr> = bound.iter().map(|b| b.listener.listen).collect();
    if let Some((_, l)) = &admin_listener {
        own.push(l.local_addr()?);
    }
    crate::acl::local::refresh();
    // Before the policy: TLS configs are built for kernel TLS when it is on.
    crate::tls::set_ktls(false);
    if bound.iter().any(|b| b.listener.tls.is_some() || b.listener.target_tls.is_some()) {
        crate::tls::set_ktls(ktls_available(cfg.tls.ktls));
    }
    if let Some(problem) = cfg.admin.open_problem() {
        anyhow::bail!("{problem}");
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
    let policy = Arc::new(policy);
    let conn_limits =
        ConnLimits::new(cfg.limits.max_connections_per_client, cfg.limits.max_connections_per_user);
    let traffic = Traffic::new();
    let hasher = Arc::new(
        crate::auth::Hasher::start(crate::auth::HasherLimits::of(&cfg.auth))
            .context("cannot start the password hashing threads")?,
    );
    let kib = policy.users.max_memory_kib();
    if kib > 0 {
        tracing::info!(
            "password hashes: {} thread(s), each holding up to {} MiB (argon2id m_cost)",
            cfg.auth.hash_threads,
            kib.div_ceil(1024)
        );
    }
    // Its error names the file or socket.
    let sink = Sink::open(&cfg.log)?;
    let (stop, shutdown) = watch::channel(false);
    let open = Arc::new(AtomicUsize::new(0));
    let stats: Vec<_> = (0..workers).map(|_| crate::metrics::WorkerStats::new()).collect();
    let readiness = Arc::new(crate::metrics::Readiness::default());
    let (admin_view, view) = watch::channel(admin_view(&bound, &policy));
    let admin = match admin_listener {
        Some((listen, listener)) => Some(crate::admin::start(
            &cfg.admin,
            listen,
            listener,
            crate::admin::State {
                workers: stats.clone(),
                readiness: readiness.clone(),
                view,
                shutdown: shutdown.clone(),
            },
        )?),
        None => None,
    };
    let in_force = InForce::new(workers);
    let switches = Arc::new(crate::relay::Switches::default());
    let mut threads = Vec::new();
    let mut senders = Vec::new();
    // Each worker's listeners, sent by `serve` (after root is given up).
    let mut first = Vec::new();
    for (id, stats) in stats.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut listeners = Vec::new();
        for b in &bound {
            listeners.push((b.listener.clone(), Some(b.for_worker(id, workers)?)));
        }
        first.push(Update { policy: policy.clone(), sink: sink.clone(), listeners });
        senders.push(tx);
        let policy = policy.clone();
        let (in_force, switches) = (in_force.clone(), switches.clone());
        let conn_limits = conn_limits.clone();
        let traffic = traffic.clone();
        let sink = sink.clone();
        let shutdown = shutdown.clone();
        let open = open.clone();
        let hasher = hasher.clone();
        let t = std::thread::Builder::new().name(format!("rustle-w{id}")).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("worker {id}: cannot start a runtime: {e}");
                    return;
                }
            };
            crate::metrics::install(id, stats);
            crate::relay::count_switches_in(switches);
            let local = tokio::task::LocalSet::new();
            let worker = Rc::new(Worker::new(
                id,
                policy,
                shutdown,
                conn_limits,
                traffic,
                sink,
                open,
                hasher,
            ));
            in_force.took(id, policy_of(&worker));
            // The worker's housekeeping runs as a task of its own: the future given to
            // `block_on` is polled at every wake-up of the event loop, and a join handle
            // costs less to poll than the housekeeping's select.
            local.block_on(&rt, async {
                let _ = tokio::task::spawn_local(worker_main(worker, rx, in_force)).await;
            });
        })?;
        threads.push(t);
    }
    let state = Mutex::new(State { bound, policy, config, sink });
    Ok(Running {
        first: Mutex::new(first),
        threads,
        stop,
        workers: senders,
        state,
        traffic,
        conn_limits,
        in_force,
        switches,
        readiness,
        admin,
        admin_view,
    })
}

/// What the admin endpoint's scrapes read of the listeners and the policy.
fn admin_view(bound: &[Bound], policy: &Arc<Policy>) -> Arc<crate::admin::View> {
    let listeners = bound
        .iter()
        .map(|b| crate::metrics::ListenerLabel {
            name: b.listener.name.clone().unwrap_or_else(|| b.listener.listen.to_string()),
            kind: b.listener.kind.as_str(),
            counters: b.listener.counters.clone(),
        })
        .collect();
    Arc::new(crate::admin::View { listeners, policy: policy.clone() })
}

/// Descriptors the proxy holds besides its connections: standard streams, the event
/// loops and their wake-ups, listening sockets, the access log, DNS lookups.
const SPARE_FILES: u64 = 64;

/// Raises the soft open-file limit to the hard one (service managers usually leave the
/// soft limit at 1024: about 500 proxied connections), and warns, with the figures, when
/// even the hard limit is below what `limits.max_connections` needs: a proxied connection
/// holds two descriptors (client and upstream), four more while splicing (two pipes); an
/// HTTP/2 stream with an upstream takes a place of its own (its upstream socket), so two
/// per place bounds HTTP/2 clients too. A client connection doing connection-based
/// authentication (NTLM, Negotiate) may also hold up to two idle origin connections pinned
/// to it, which this estimate leaves out.
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
             limits.max_connections = {connections} needs (2 per proxied connection or HTTP/2 \
             stream, more while splicing): raise it (systemd LimitNOFILE=, ulimit -Hn) or lower max_connections"
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

/// A listening socket registered with this worker's event loop.
#[derive(Clone)]
enum Registered {
    Tcp(Rc<AsyncFd<std::net::TcpListener>>),
    Udp(Rc<tokio::net::UdpSocket>),
}

/// The listeners a worker serves: for each, its sockets and the task serving each (an
/// accept loop, or the UDP relay).
#[derive(Default)]
struct Serving(HashMap<ListenerKey, Vec<(Registered, tokio::task::JoinHandle<()>)>>);

impl Serving {
    /// Serves `listeners` from now on. The task serving a socket ends and a new one takes
    /// the same socket with the new settings (aborting a task at its wait for the next
    /// connection loses none: the connections queued stay in the socket's queue, and
    /// those accepted already run in tasks of their own). Listeners not named end; their
    /// sockets close (the worker's descriptors).
    fn apply(&mut self, worker: &Rc<Worker>, listeners: Vec<(Arc<Listener>, Option<Vec<Socket>>)>) {
        let mut old = std::mem::take(&mut self.0);
        for (l, sockets) in listeners {
            let running = old.remove(&l.key).unwrap_or_default();
            let mut registered = Vec::new();
            for (r, task) in running {
                task.abort();
                registered.push(r);
            }
            if let Some(sockets) = sockets {
                registered.clear();
                for s in sockets {
                    let r = match s {
                        Socket::Tcp(s) => {
                            crate::sys::watch_listener(s).map(|s| Registered::Tcp(Rc::new(s)))
                        }
                        Socket::Udp(s) => {
                            tokio::net::UdpSocket::from_std(s).map(|s| Registered::Udp(Rc::new(s)))
                        }
                    };
                    match r {
                        Ok(r) => registered.push(r),
                        Err(e) => tracing::error!(
                            "worker {}: cannot use the listener on {}: {e}",
                            worker.id,
                            l.listen
                        ),
                    }
                }
            }
            let tasks = registered
                .into_iter()
                .map(|r| {
                    let task =
                        match r.clone() {
                            Registered::Tcp(s) => {
                                tokio::task::spawn_local(accept_loop(worker.clone(), l.clone(), s))
                            }
                            Registered::Udp(s) => tokio::task::spawn_local(
                                crate::udp::serve_relay(worker.clone(), l.clone(), s),
                            ),
                        };
                    (r, task)
                })
                .collect();
            self.0.insert(l.key, tasks);
        }
        for (_, tasks) in old {
            for (_, task) in tasks {
                task.abort();
            }
        }
    }
}

/// The policy a worker has in force.
fn policy_of(worker: &Worker) -> Arc<Policy> {
    Arc::clone(&worker.policy())
}

async fn worker_main(
    worker: Rc<Worker>,
    mut updates: mpsc::UnboundedReceiver<Update>,
    in_force: Arc<InForce>,
) {
    // The first update (`Running::serve`) brings the listeners.
    let mut serving = Serving::default();
    // Housekeeping: flush the access log, close expired idle origin connections, end
    // idle tunnels (their deadlines are swept here rather than timed one by one).
    crate::idle::sweep_relays_here();
    drop(tokio::task::spawn_local(crate::tunnel::park::serve_here()));
    if worker.id == 0 {
        drop(tokio::task::spawn_local(probe_parents(worker.clone())));
    }
    let mut shutdown = worker.shutdown.clone();
    // One tick flushes the access log (a line waits in a worker's buffer no longer) and
    // sweeps the waits.
    let mut flush = tokio::time::interval(crate::idle::TICK);
    let mut last_sweep = Instant::now();
    // The first worker reads the host's addresses again now and then (`acl::local`).
    let mut last_local = Instant::now();
    loop {
        tokio::select! {
            _ = flush.tick() => {
                worker.log.flush();
                let now = Instant::now();
                worker.waiters.sweep(now, false);
                worker.upstreams.tick(now);
                crate::idle::sweep_relays(now);
                if worker.id == 0 && last_local.elapsed() >= crate::acl::local::REFRESH_EVERY {
                    crate::acl::local::refresh();
                    last_local = Instant::now();
                }
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
            Some(update) = updates.recv() => {
                worker.reconfigure(update.policy, update.sink);
                serving.apply(&worker, update.listeners);
                in_force.took(worker.id, policy_of(&worker));
            }
        }
    }
    // Draining: listeners stop (the accept loops end on the shutdown signal, or here);
    // wait for connections in flight. A kept-alive HTTP/1 connection is not cut between
    // requests, where a request of its client may be on its way: its next request is
    // answered with `Connection: close` (HTTP/2 connections get GOAWAY and finish their
    // streams), and one that sends nothing for `DRAIN_IDLE_GRACE` is closed.
    serving.apply(&worker, Vec::new());
    worker.stopping.set(true);
    worker.upstreams.clear();
    let start = Instant::now();
    let deadline = start + worker.cfg().timeouts.shutdown;
    while worker.active() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = Instant::now();
        worker.waiters.sweep(now, now >= start + DRAIN_IDLE_GRACE);
        crate::idle::sweep_relays(now);
        crate::tunnel::park::sweep(now);
        worker.log.flush();
    }
    // The drain is over: idle connections are woken to close (cleanly: close_notify on
    // TLS), given a moment to do so.
    worker.waiters.sweep(Instant::now(), true);
    let closing = Instant::now() + IDLE_CLOSE_GRACE;
    while worker.active() > 0 && Instant::now() < closing {
        tokio::time::sleep(Duration::from_millis(5)).await;
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
                worker.upstreams.probe(&policy, parent, &worker.cfg().timeouts).await;
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
    listener: Rc<AsyncFd<std::net::TcpListener>>,
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
        let (guard, open, over_client) = worker.admit(peer.ip(), &config);
        let l = config.clone();
        let overloaded = open > worker.cfg().limits.max_connections || over_client;
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
                crate::metrics::refused(&config.counters, crate::metrics::Refused::Limit);
                tracing::warn!("{peer}: refused, {open} connections open");
                let why = "too many connections";
                crate::dispatch::log_failure(&worker, &l, peer, std::time::Instant::now(), why);
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
