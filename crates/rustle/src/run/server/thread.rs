//! The worker thread's loop: its listeners' tasks, housekeeping, updates, and the drain.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::accept::accept_loop;
use super::plan::InForce;
use super::probes::probe_parents;
use super::{Socket, Update};
use crate::config::ListenerKey;
use crate::front::worker::Worker;
use crate::policy::Listener;
use crate::policy::Policy;

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
                    let r =
                        match s {
                            Socket::Tcp(s) => crate::io::sys::watch_listener(s)
                                .map(|s| Registered::Tcp(Rc::new(s))),
                            Socket::Udp(s) => tokio::net::UdpSocket::from_std(s)
                                .map(|s| Registered::Udp(Rc::new(s))),
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
                    let task = match r.clone() {
                        Registered::Tcp(s) => {
                            tokio::task::spawn_local(accept_loop(worker.clone(), l.clone(), s))
                        }
                        Registered::Udp(s) => tokio::task::spawn_local(
                            crate::front::udp::serve_relay(worker.clone(), l.clone(), s),
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
pub(super) fn policy_of(worker: &Worker) -> Arc<Policy> {
    Arc::clone(&worker.policy())
}

pub(super) async fn worker_main(
    worker: Rc<Worker>,
    mut updates: mpsc::UnboundedReceiver<Update>,
    in_force: Arc<InForce>,
) {
    // The first update (`Running::serve`) brings the listeners.
    let mut serving = Serving::default();
    // Housekeeping: flush the access log, close expired idle origin connections, end
    // idle tunnels (their deadlines are swept here rather than timed one by one).
    crate::io::idle::sweep_relays_here();
    drop(tokio::task::spawn_local(crate::front::tunnel::park::serve_here()));
    if worker.id == 0 {
        drop(tokio::task::spawn_local(probe_parents(worker.clone())));
    }
    let mut shutdown = worker.shutdown.clone();
    // One tick flushes the access log (a line waits in a worker's buffer no longer) and
    // sweeps the waits.
    let mut flush = tokio::time::interval(crate::io::idle::TICK);
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
                crate::io::idle::sweep_relays(now);
                if worker.id == 0 && last_local.elapsed() >= crate::acl::local::REFRESH_EVERY {
                    crate::acl::local::refresh();
                    last_local = Instant::now();
                }
                if last_sweep.elapsed() >= SWEEP_EVERY {
                    worker.cuts.sweep();
                    worker.upstreams.sweep();
                    worker.trim_bufs(crate::front::tunnel::park::sweep(now));
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
                worker.set_listeners(update.listeners.iter().map(|(l, _)| l.clone()).collect());
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
        crate::io::idle::sweep_relays(now);
        crate::front::tunnel::park::sweep(now);
        worker.log.flush();
    }
    // The drain is over: idle connections are woken to close (cleanly: close_notify on
    // TLS), given a moment to do so.
    worker.waiters.sweep(Instant::now(), true);
    let closing = Instant::now() + IDLE_CLOSE_GRACE;
    while worker.active() > 0 && Instant::now() < closing {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    crate::front::tunnel::park::close_all();
    if worker.active() > 0 {
        tracing::warn!(
            "worker {}: {} connection(s) still open at the shutdown deadline; closing them",
            worker.id,
            worker.active()
        );
    }
    worker.log.flush();
}
