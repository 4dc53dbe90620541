//! Probes: the parents' health probes (first worker) and the kernel-TLS probe at start.

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::front::worker::Worker;

/// Health probes of the parents that have one (`probe`, every `probe_every`), run by the
/// first worker for the whole process; the policy in force decides which, so a reload
/// adds and removes them.
pub(super) async fn probe_parents(worker: Rc<Worker>) {
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

/// Kernel TLS: probed and said once at start. Where the kernel has the `tls` module,
/// finished handshakes hand their keys to it (the `ktls` crate); elsewhere TLS runs in
/// user space (rustls).
#[cfg(feature = "ktls")]
pub(super) fn ktls_available(mode: crate::config::Ktls) -> bool {
    if mode == crate::config::Ktls::Off {
        return false;
    }
    match crate::io::sys::ktls_probe() {
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

/// Built without the `ktls` feature: TLS runs in user space (rustls), said once at start
/// as where the kernel lacks the module.
#[cfg(not(feature = "ktls"))]
pub(super) fn ktls_available(mode: crate::config::Ktls) -> bool {
    if mode != crate::config::Ktls::Off {
        tracing::info!(
            "kernel TLS is not available here (rustle was built without the `ktls` feature); \
             TLS runs in user space (rustls)"
        );
    }
    false
}
