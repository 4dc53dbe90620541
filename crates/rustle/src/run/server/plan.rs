//! What a reload changes: a `Plan` (listeners kept, bound anew or dropped; the access log)
//! made ready without touching what is in force, then put in force on every worker.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{admin_view, bind, Bound, Inherited, Running, State, Update};
use crate::config::Config;
use crate::policy::Listener;
use crate::policy::Policy;
use crate::telemetry::accesslog::Sink;

/// How long a reload waits for every worker to have the new policy in force before it says
/// so anyway (a worker takes it at its next turn of its loop, within microseconds unless
/// its thread is starved; the wait only bounds a stuck worker).
pub(super) const IN_FORCE_WITHIN: Duration = Duration::from_secs(5);

/// The policy each worker has in force (by identity), so that a reload returns, and says
/// "reloaded", only once every worker has taken it.
pub(super) struct InForce {
    taken: Mutex<Vec<Option<Arc<Policy>>>>,
    changed: std::sync::Condvar,
}

impl InForce {
    pub(super) fn new(workers: usize) -> Arc<InForce> {
        Arc::new(InForce { taken: Mutex::new(vec![None; workers]), changed: Default::default() })
    }

    /// Worker `id` has `policy` in force.
    pub(super) fn took(&self, id: usize, policy: Arc<Policy>) {
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
    pub(super) fn wait(&self, policy: &Arc<Policy>, within: Duration) -> Vec<usize> {
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

/// A reload made ready but not yet in force: new listeners bound, the access log opened.
/// Dropping it closes what it opened and changes nothing.
pub(crate) struct Plan {
    listeners: Vec<Planned>,
    /// Listeners of the running set that the new configuration drops (by position).
    removed: Vec<usize>,
    sink: Sink,
    config: Arc<Config>,
    /// Settings changed that only a restart or a takeover puts in force.
    pub(crate) warnings: Vec<String>,
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
    pub(crate) fn listeners(&self) -> Vec<Arc<Listener>> {
        self.listeners
            .iter()
            .map(|p| match p {
                Planned::Kept(_, l) => l.clone(),
                Planned::Fresh(b) => b.listener.clone(),
            })
            .collect()
    }

    /// Their addresses and the admin endpoint's (refused as destinations).
    pub(crate) fn own(&self) -> Vec<SocketAddr> {
        self.listeners().iter().map(|l| l.listen).chain(self.admin).collect()
    }
}

impl Running {
    /// Everything a reload to `cfg` needs that can fail, without changing anything in
    /// force: listeners the running set lacks are bound (a failure, such as an address
    /// in use, fails the whole reload), the others matched to running ones by their key
    /// (their sockets stay, so the port never refuses a connection), a new access-log
    /// target opened.
    pub(crate) fn prepare(&self, cfg: &Config) -> Result<Plan, String> {
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
        crate::io::relay::kernel::prepare(cfg.relay.kernel_forwarding)?;
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
    pub(crate) fn commit(&self, plan: Plan, policy: Policy) {
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
}
