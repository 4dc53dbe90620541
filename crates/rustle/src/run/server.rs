//! Workers and listeners. Each worker is a thread running a current-thread tokio runtime
//! with its own SO_REUSEPORT listening sockets, so the kernel spreads new connections over
//! the workers and a connection never leaves the thread that accepted it: no lock, no
//! atomic and no cross-thread wake-up on the request path. The main thread keeps a copy
//! of every listening socket (`bind`): a reload binds, keeps or closes listeners and tells
//! each worker over its own channel (`Update`); a takeover hands the sockets to the new
//! process.
//!
//! `bind`: the listening sockets; `plan`: what a reload changes, made ready then put in
//! force; `thread`: a worker's loop; `accept`: a TCP listener's accept loop; `probes`: the
//! parents' health probes and the kernel-TLS probe.

mod accept;
mod bind;
mod plan;
mod probes;
mod thread;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::sync::{mpsc, watch};

pub(crate) use self::bind::{ensure_unused, Bound, Group, Inherited, Socket};
use self::plan::InForce;
use self::probes::ktls_available;
use self::thread::{policy_of, worker_main};
use crate::config::{Config, ListenerKind};
use crate::front::worker::Worker;
use crate::limits::{ConnLimits, Traffic};
use crate::policy::Listener;
use crate::policy::Policy;
use crate::telemetry::accesslog::Sink;

/// What a worker is told to put in force: at start, on a reload, and when a takeover
/// asks it to stop accepting (no listener).
pub(crate) struct Update {
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
    state: Arc<Mutex<State>>,
    traffic: Arc<Traffic>,
    /// The users API's changes, put on top of the configuration's users by every policy
    /// built (`policy::overlay`).
    overlay: Arc<crate::policy::overlay::Overlay>,
    /// Held while a policy is built and put in force (a reload, a change of the users
    /// API), so that neither puts in force a policy built before the other's.
    publishing: Arc<Mutex<()>>,
    /// The quotas and their usage (`state`), and the `rustle-quota` thread.
    quotas: Arc<crate::state::Keeper>,
    conn_limits: Arc<ConnLimits>,
    in_force: Arc<InForce>,
    switches: Arc<crate::io::relay::Switches>,
    /// Each worker's first listeners, until `serve` sends them.
    first: Mutex<Vec<Update>>,
    /// Whether the proxy takes new connections (`/readyz`).
    readiness: Arc<crate::telemetry::metrics::Readiness>,
    /// The admin endpoint, when `[admin] listen` is set, and what its scrapes read.
    admin: Option<crate::run::admin::Handle>,
    admin_view: Arc<watch::Sender<Arc<crate::run::admin::View>>>,
    /// The fleet thread, with `[state] backend = "redis"`.
    fleet: Option<crate::state::fleet::Running>,
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
    pub(crate) fn join(self) {
        self.state().bound.clear();
        for t in self.threads {
            let _ = t.join();
        }
        // RADIUS accounting: the Stops of the sessions the connections held (all ended),
        // answered before the process goes.
        crate::policy::auth::backend::flush_accounting(std::time::Duration::from_secs(3));
        // The last usage written once no worker counts any more.
        self.quotas.stop();
        // Once no connection is left (and the keeper's last flush is out): the fleet
        // stops counting this instance's.
        if let Some(fleet) = self.fleet {
            fleet.stop();
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
    pub(crate) fn readiness(&self) -> &Arc<crate::telemetry::metrics::Readiness> {
        &self.readiness
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes each way per authenticated user so far: (user, up, down), sorted by user.
    pub fn traffic(&self) -> Vec<(String, u64, u64)> {
        self.traffic.snapshot()
    }

    /// The quotas and their usage (the admin API's `usage`, `reset`, `top_up`).
    pub(crate) fn quotas(&self) -> &Arc<crate::state::Keeper> {
        &self.quotas
    }

    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }

    /// The policy in force.
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.state().policy.clone()
    }

    /// The users API's overlay (`policy::overlay`).
    pub(crate) fn overlay(&self) -> &Arc<crate::policy::overlay::Overlay> {
        &self.overlay
    }

    /// The per-user counters (and cut flags) of every worker.
    pub(crate) fn user_traffic(&self) -> &Arc<Traffic> {
        &self.traffic
    }

    /// Held while a policy is built and put in force.
    pub(crate) fn publishing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.publishing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration in force, as derived (listeners as configured).
    pub fn config(&self) -> Arc<Config> {
        self.state().config.clone()
    }

    /// The fleet's handle, with `[state] backend = "redis"`.
    #[allow(dead_code)] // The quota keeper's way to the fleet.
    pub(crate) fn fleet(&self) -> Option<&crate::state::fleet::FleetHandle> {
        self.fleet.as_ref().map(|f| f.handle())
    }

    /// Every listener's kind and bound address, in configuration order.
    pub fn addrs(&self) -> Vec<(ListenerKind, SocketAddr)> {
        self.state().bound.iter().map(|b| (b.listener.kind, b.listener.listen)).collect()
    }

    /// The listeners as bound (ports resolved).
    pub(crate) fn listeners(&self) -> Vec<Arc<Listener>> {
        self.state().bound.iter().map(|b| b.listener.clone()).collect()
    }

    /// Where the access log goes (SIGUSR1 reopens a file).
    pub(crate) fn access_log(&self) -> Sink {
        self.state().sink.clone()
    }

    /// Mode switches of this proxy's relays so far: (to splice, back to copy).
    pub fn mode_switches(&self) -> (u64, u64) {
        self.switches.get()
    }

    /// Tunnels of this proxy the kernel has taken over so far (`[relay]
    /// kernel_forwarding`), and those it gave back to the relay (a reload gave them a
    /// bandwidth limit).
    pub fn kernel_tunnels(&self) -> (u64, u64) {
        self.switches.kernel()
    }

    /// The workers begin accepting (`start_with` leaves them idle), and `/readyz` says
    /// ready. Once only; later calls do nothing.
    pub(crate) fn serve(&self) {
        let first = std::mem::take(&mut *self.first.lock().unwrap_or_else(|p| p.into_inner()));
        // The policy in force now: the users API may have changed it since the start.
        let policy = self.policy();
        for (tx, mut update) in self.workers.iter().zip(first) {
            update.policy = policy.clone();
            let _ = tx.send(update);
        }
        self.readiness.set_ready();
    }

    /// Logs where each listener listens (`start_with` leaves it to the caller, which
    /// may first give root up: the lines tell that the proxy is ready).
    pub(crate) fn announce(&self) {
        let workers = self.workers.len();
        for b in &self.state().bound {
            let l = &b.listener;
            tracing::info!("listening on {} ({}), {workers} worker(s)", l.listen, l.kind);
        }
    }

    /// Every worker stops accepting (a takeover: the new process accepts on the same
    /// sockets); connections in flight go on. The main thread keeps its copies until it
    /// exits.
    pub(crate) fn stop_accepting(&self) {
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
    pub(crate) fn with_sockets<T>(&self, f: impl FnOnce(&[Bound]) -> T) -> T {
        f(&self.state().bound)
    }

    /// The admin endpoint's listening socket and the address configured for it, to hand
    /// to a new process.
    pub(crate) fn admin_socket(&self) -> Option<(SocketAddr, std::os::fd::BorrowedFd<'_>)> {
        self.admin.as_ref().map(|a| (a.configured, a.socket()))
    }

    /// The admin endpoint stops accepting (a takeover: the new process answers on the
    /// same socket); answers under way finish.
    pub(crate) fn release_admin(&self) {
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
pub(crate) fn start_with(cfg: Config, mut inherited: Inherited) -> anyhow::Result<Running> {
    let config = Arc::new(cfg.clone());
    let workers = cfg.worker_count();
    crate::telemetry::metrics::set_workers(workers);
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
        (Some(listen), None) => Some((listen, crate::run::admin::bind(listen)?)),
        (None, _) => None,
    };
    let mut own: Vec<SocketAddr> = bound.iter().map(|b| b.listener.listen).collect();
    if let Some((_, l)) = &admin_listener {
        own.push(l.local_addr()?);
    }
    crate::acl::local::refresh();
    // Before the policy: TLS configs are built for kernel TLS when it is on.
    crate::io::tls::set_ktls(false);
    if bound.iter().any(|b| b.listener.tls.is_some() || b.listener.target_tls.is_some()) {
        crate::io::tls::set_ktls(ktls_available(cfg.tls.ktls));
    }
    crate::io::relay::kernel::prepare(cfg.relay.kernel_forwarding).map_err(anyhow::Error::msg)?;
    crate::io::relay::kernel::announce(cfg.relay.kernel_forwarding);
    if let Some(problem) = cfg.admin.open_problem() {
        anyhow::bail!("{problem}");
    }
    // Its token file is read before any thread starts (the admin thread reads it again).
    if cfg.admin.listen.is_some() {
        cfg.admin.read_token().map_err(anyhow::Error::msg)?;
        cfg.admin.read_api_token().map_err(anyhow::Error::msg)?;
        if let Some(listen) = cfg.admin.api_cleartext() {
            tracing::warn!(
                "admin: the users API listens on {listen}, not a loopback address: its token \
                 and the passwords it is sent cross the network in cleartext"
            );
        }
    }
    let overlay = crate::policy::overlay::Overlay::load(cfg.admin.users_state.as_deref())
        .map_err(anyhow::Error::msg)?;
    let policy = Policy::build_with(&cfg, &own, Some(&overlay.snapshot()))
        .map_err(|p| anyhow::anyhow!(p.join("\n")))?;
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
    let fleet = match cfg.state.redis() {
        Some(redis) => Some(
            crate::state::fleet::start(&redis, conn_limits.clone())
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        None => None,
    };
    if let Some(fleet) = &fleet {
        fleet.make_current();
    }
    let traffic = Traffic::new();
    let quotas = Arc::new(crate::state::Keeper::start(&cfg, traffic.clone(), groups_of(&policy))?);
    let hasher = Arc::new(
        crate::policy::auth::Hasher::start(crate::policy::auth::HasherLimits::of(&cfg.auth))
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
    let stats: Vec<_> =
        (0..workers).map(|_| crate::telemetry::metrics::WorkerStats::new()).collect();
    let readiness = Arc::new(crate::telemetry::metrics::Readiness::default());
    let (admin_view, view) = watch::channel(admin_view(&bound, &policy));
    let admin_view = Arc::new(admin_view);
    let admin_stats = stats.clone();
    let in_force = InForce::new(workers);
    let switches = Arc::new(crate::io::relay::Switches::default());
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
            crate::telemetry::metrics::install(id, stats);
            crate::io::relay::count_switches_in(switches);
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
    let state = Arc::new(Mutex::new(State { bound, policy, config, sink }));
    let publishing = Arc::new(Mutex::new(()));
    let admin = match admin_listener {
        Some((listen, listener)) => {
            let publisher = Publisher {
                state: state.clone(),
                workers: senders.clone(),
                traffic: traffic.clone(),
                overlay: overlay.clone(),
                admin_view: admin_view.clone(),
                publishing: publishing.clone(),
                in_force: in_force.clone(),
                quotas: quotas.clone(),
            };
            Some(crate::run::admin::start(
                &cfg.admin,
                listen,
                listener,
                crate::run::admin::State {
                    workers: admin_stats,
                    readiness: readiness.clone(),
                    quotas: quotas.clone(),
                    view,
                    shutdown: shutdown.clone(),
                    fleet: fleet.as_ref().map(|f| f.handle().clone()),
                    users: crate::run::admin::UsersState {
                        traffic: traffic.clone(),
                        overlay: overlay.clone(),
                        republish: Arc::new(move || publisher.republish()),
                        quotas: quotas.clone(),
                    },
                },
            )?)
        }
        None => None,
    };
    Ok(Running {
        overlay,
        publishing,
        first: Mutex::new(first),
        threads,
        stop,
        workers: senders,
        state,
        traffic,
        quotas,
        conn_limits,
        in_force,
        switches,
        readiness,
        admin,
        admin_view,
        fleet,
    })
}

/// What puts a policy with the users API's changes in force from the admin thread: the
/// running proxy's state, its workers' channels and counters.
struct Publisher {
    state: Arc<Mutex<State>>,
    workers: Vec<mpsc::UnboundedSender<Update>>,
    traffic: Arc<Traffic>,
    overlay: Arc<crate::policy::overlay::Overlay>,
    admin_view: Arc<watch::Sender<Arc<crate::run::admin::View>>>,
    publishing: Arc<Mutex<()>>,
    in_force: Arc<InForce>,
    quotas: Arc<crate::state::Keeper>,
}

impl Publisher {
    /// Builds the policy of the configuration in force with the overlay as it is now and
    /// puts it in force for new connections and requests (the listeners unchanged); the
    /// connections of users it no longer has are cut.
    fn republish(&self) -> Result<(), String> {
        let _publishing = self.publishing.lock().unwrap_or_else(|p| p.into_inner());
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let own = state.policy.builtins.own_addresses.clone();
        let overlay = self.overlay.snapshot();
        let mut policy =
            Policy::build_with(&state.config, &own, Some(&overlay)).map_err(|p| p.join("; "))?;
        policy.routes.keep_health_of(&state.policy.routes);
        let policy = Arc::new(policy);
        crate::policy::overlay::settle(&self.traffic, &state.policy.users, &policy.users);
        // The quotas follow the users' groups as changed.
        if let Err(e) = self.quotas.configure(&state.config, groups_of(&policy)) {
            tracing::warn!("quotas: {e}");
        }
        for tx in &self.workers {
            let listeners = state.bound.iter().map(|b| (b.listener.clone(), None)).collect();
            let update = Update { policy: policy.clone(), sink: state.sink.clone(), listeners };
            let _ = tx.send(update);
        }
        let _ = self.admin_view.send(admin_view(&state.bound, &policy));
        state.policy = policy.clone();
        drop(state);
        // The answer says the change is in force: every worker has taken it.
        let late = self.in_force.wait(&policy, plan::IN_FORCE_WITHIN);
        if !late.is_empty() {
            tracing::warn!("worker(s) {late:?} have not taken the users change yet");
        }
        Ok(())
    }
}

/// Each user's groups, as the quotas name them.
pub(crate) fn groups_of(policy: &Policy) -> std::collections::HashMap<String, Vec<String>> {
    let users = &policy.users;
    users.names().filter_map(|n| users.get(n).map(|u| (n.to_string(), u.groups.clone()))).collect()
}

/// What the admin endpoint's scrapes read of the listeners and the policy.
fn admin_view(bound: &[Bound], policy: &Arc<Policy>) -> Arc<crate::run::admin::View> {
    let listeners = bound
        .iter()
        .map(|b| crate::telemetry::metrics::ListenerLabel {
            name: b.listener.name.clone().unwrap_or_else(|| b.listener.listen.to_string()),
            kind: b.listener.kind.as_str(),
            counters: b.listener.counters.clone(),
        })
        .collect();
    Arc::new(crate::run::admin::View { listeners, policy: policy.clone() })
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
