//! The fleet thread: with `[state] backend = "redis"`, a thread `rustle-fleet` on a
//! current-thread runtime owns the `Fleet` (the Redis client) and runs a sync tick every
//! `[state] sync_interval`. No worker waits on Redis: a tick publishes this instance's
//! per-user counts and reads the fleet's into shared tables that the connection path
//! reads as it reads its local ones (`ConnLimits`, `Addrs`).
//!
//! Each tick:
//! - connections per user (`max_connections_per_user`): this instance's open connections
//!   per user published under its lease, and every user's total over the fleet read back
//!   (`Fleet::sync_conns`, one round trip); what the other instances hold goes to
//!   `ConnLimits::set_others`, which the limit check adds to the local count. A user may
//!   so exceed its limit by what other instances admitted within one tick.
//! - client addresses per user (`max_client_addresses`): the addresses in use here
//!   touched (`Fleet::touch_addrs`, a script per user with addresses here, sent together),
//!   then every user's addresses over the fleet read (`Fleet::fleet_addrs`) into
//!   `Addrs::set_fleet`. Same bound: what other instances admitted within one tick.
//! - health: with `on_state_loss = "deny"`, authenticated connections are refused while
//!   Redis is unreachable (`ConnLimits::set_state_lost`); with `"serve"` the fleet's
//!   counts are dropped and the instance goes on with its own. When Redis returns, the
//!   next tick publishes the lease and counts again: the fleet's view is whole again
//!   within one tick (leases of instances that stopped expire after `LEASES` ticks).
//!
//! Other threads reach the `Fleet` through a `FleetHandle`: `submit` sends an async job
//! to the fleet's runtime and returns a receiver for its result, so that a worker awaits
//! it without blocking its event loop, and the quota keeper sends its batches.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::redis::{Error, Fleet, Status};
use crate::config::{OnStateLoss, StateRedis};
use crate::limits::ConnLimits;

/// A lease lasts this many ticks: an instance that misses one tick (a slow reply) keeps
/// its counts, one that stopped without releasing them loses them within this.
const LEASES: u32 = 3;

/// A job for the fleet's runtime: given the `Fleet`, a future run there.
type Job = Box<dyn FnOnce(Rc<Fleet>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// What any thread holds to reach the fleet: cheap to clone, never blocks.
#[derive(Clone)]
pub(crate) struct FleetHandle {
    jobs: mpsc::UnboundedSender<Job>,
    status: Arc<Status>,
    on_state_loss: OnStateLoss,
    addr: Arc<str>,
}

impl std::fmt::Debug for FleetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetHandle").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// The fleet thread stopped: a job sent to it is not run.
// `submit`'s error: the quota keeper's way to the fleet, on its branch.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the fleet thread is not running")]
pub(crate) struct Gone;

impl FleetHandle {
    /// Runs `job` on the fleet's runtime; its result comes back through the receiver
    /// (an error if the thread stopped first). Awaiting the receiver never blocks the
    /// awaiting thread.
    // The quota keeper's way to the fleet (its batches, the fleet's totals back).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn submit<T, F, Fut>(&self, job: F) -> impl Future<Output = Result<T, Gone>>
    where
        T: Send + 'static,
        F: FnOnce(Rc<Fleet>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |fleet| {
            Box::pin(async move {
                let _ = tx.send(job(fleet).await);
            })
        });
        let sent = self.jobs.send(job).is_ok();
        async move {
            if !sent {
                return Err(Gone);
            }
            rx.await.map_err(|_| Gone)
        }
    }

    /// Runs `job` on the fleet's runtime with no answer awaited (its effect is its
    /// answer); false when the fleet thread stopped.
    pub(crate) fn spawn<F, Fut>(&self, job: F) -> bool
    where
        F: FnOnce(Rc<Fleet>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let job: Job = Box::new(move |fleet| Box::pin(job(fleet)));
        self.jobs.send(job).is_ok()
    }

    /// Health and traffic of the fleet's Redis.
    pub(crate) fn status(&self) -> &Arc<Status> {
        &self.status
    }

    pub(crate) fn on_state_loss(&self) -> OnStateLoss {
        self.on_state_loss
    }

    /// host:port of the Redis (never the URL, which may hold a password).
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }
}

/// The fleet of the running proxy, for the layers that reach it from a request (sticky
/// sessions): set while the fleet thread runs.
static CURRENT: std::sync::Mutex<Option<FleetHandle>> = std::sync::Mutex::new(None);

/// The running fleet's handle, if there is one. A lock and a clone: for a session's
/// first use, not for every request.
pub(crate) fn current() -> Option<FleetHandle> {
    CURRENT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The running fleet thread.
pub(crate) struct Running {
    handle: FleetHandle,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    pub(crate) fn handle(&self) -> &FleetHandle {
        &self.handle
    }

    /// Makes this the fleet `current` gives (the running proxy's).
    pub(crate) fn make_current(&self) {
        *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.handle.clone());
    }

    /// Stops the ticks, releases this instance's lease (its connection counts stop
    /// counting for the fleet at once) and waits for the thread.
    pub(crate) fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let mut current = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|h| h.jobs.same_channel(&self.handle.jobs)) {
            *current = None;
        }
        drop(current);
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Starts the fleet thread for `cfg`, keeping `limits` (and its table of client
/// addresses) in step with the fleet. The password and CA files are read now.
pub(crate) fn start(cfg: &StateRedis, limits: Arc<ConnLimits>) -> Result<Running, Error> {
    let fleet = Fleet::connect(cfg)?;
    let status = fleet.status();
    let addr: Arc<str> = fleet.addr().into();
    let (jobs, rx) = mpsc::unbounded_channel();
    let (stop, stopped) = watch::channel(false);
    let interval = cfg.sync_interval;
    let on_state_loss = cfg.on_state_loss;
    let thread = std::thread::Builder::new()
        .name("rustle-fleet".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("state: cannot start the fleet thread's runtime: {e}");
                    return;
                }
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, run(Rc::new(fleet), limits, interval, rx, stopped));
        })
        .map_err(|e| Error::Config(format!("cannot start the fleet thread: {e}")))?;
    tracing::info!(
        "state: shared through Redis at {addr} (a sync every {interval:?}, on_state_loss = {})",
        match on_state_loss {
            OnStateLoss::Serve => "\"serve\"",
            OnStateLoss::Deny => "\"deny\"",
        }
    );
    let handle = FleetHandle { jobs, status, on_state_loss, addr };
    Ok(Running { handle, stop, thread: Some(thread) })
}

async fn run(
    fleet: Rc<Fleet>,
    limits: Arc<ConnLimits>,
    interval: Duration,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The tick runs as a task of its own, so that jobs (a sticky session's first use)
    // are not held up behind a slow tick.
    let ticking = {
        let (fleet, limits) = (fleet.clone(), limits.clone());
        tokio::task::spawn_local(async move {
            loop {
                ticks.tick().await;
                tick(&fleet, &limits, interval * LEASES).await;
            }
        })
    };
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => {
                    tokio::task::spawn_local(job(fleet.clone()));
                }
                None => break,
            },
            _ = stopped.changed() => break,
        }
    }
    ticking.abort();
    limits.set_state_lost(false);
    if let Err(e) = fleet.release().await {
        tracing::warn!(
            "state: could not release this instance's lease ({e}): it expires by itself"
        );
    }
}

/// One sync: counts published and the fleet's read; the state-loss switch set.
async fn tick(fleet: &Fleet, limits: &ConnLimits, lease: Duration) {
    let conns = sync_conns(fleet, limits, lease).await;
    // Tried even when the first failed: it drops the fleet's addresses then.
    let addrs = sync_addrs(fleet, limits).await;
    let ok = conns && addrs;
    let lost = !ok && fleet.on_state_loss() == OnStateLoss::Deny;
    limits.set_state_lost(lost);
}

/// Publishes this instance's connections per user and learns the others'; false when
/// Redis could not be reached (the others' counts are then dropped).
async fn sync_conns(fleet: &Fleet, limits: &ConnLimits, lease: Duration) -> bool {
    let mine = limits.user_counts();
    let counts: Vec<(&str, u64)> = mine.iter().map(|(u, n)| (&**u, *n as u64)).collect();
    match fleet.sync_conns(&counts, lease).await {
        Ok(totals) => {
            let mine: HashMap<&str, u64> = counts.into_iter().collect();
            let others = totals
                .into_iter()
                .filter_map(|(user, total)| {
                    let own = mine.get(user.as_str()).copied().unwrap_or(0);
                    let others = total.saturating_sub(own);
                    (others > 0).then_some((user, others as usize))
                })
                .collect();
            limits.set_others(&others);
            true
        }
        Err(e) => {
            limits.set_others(&HashMap::new());
            tracing::debug!("state: connection counts not synced: {e}");
            false
        }
    }
}

/// Touches the client addresses in use here and learns the fleet's; false when Redis
/// could not be reached (the fleet's addresses are then dropped).
async fn sync_addrs(fleet: &Fleet, limits: &ConnLimits) -> bool {
    let local = limits.addrs.local(crate::limits::now());
    // One script per user, sent together on the one (multiplexed) connection: a round
    // trip in all, not one per user.
    let touches = local.iter().map(|(user, limit, ips)| async move {
        let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        let max = u32::try_from(limit.max).unwrap_or(u32::MAX);
        fleet.touch_addrs(user, &ips, limit.ttl, max).await
    });
    let mut ok = true;
    for result in futures_util::future::join_all(touches).await {
        if let Err(e) = result {
            tracing::debug!("state: client addresses not synced: {e}");
            ok = false;
        }
    }
    let all = match ok {
        true => fleet.fleet_addrs().await,
        false => Ok(Vec::new()),
    };
    match all {
        Ok(all) => {
            let all: HashMap<String, Vec<IpAddr>> = all
                .into_iter()
                .map(|(user, ips)| (user, ips.iter().filter_map(|a| a.parse().ok()).collect()))
                .collect();
            limits.addrs.set_fleet(&all);
            ok
        }
        Err(e) => {
            tracing::debug!("state: client addresses not read: {e}");
            limits.addrs.set_fleet(&HashMap::new());
            false
        }
    }
}

#[cfg(test)]
mod tests;
