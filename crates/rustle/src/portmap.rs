//! The TCP port relay (3proxy's tcppm, nginx's stream, haproxy's mode tcp): every
//! connection accepted on the listener is relayed to the listener's fixed target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::accesslog::Entry;
use crate::config::Listener;
use crate::error::Error;
use crate::server::ConnGuard;

pub async fn serve(guard: ConnGuard, listener: Arc<Listener>, stream: TcpStream, peer: SocketAddr) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let Some(target) = &listener.target else {
        // The configuration check makes this impossible; close rather than panic.
        return;
    };
    let cfg = &worker.cfg;
    let mut upstream = None;
    let mut totals = crate::relay::Totals::default();
    let result: Result<(), Error> = async {
        let (up, addr) =
            worker.upstreams.connect(&target.host, target.port, cfg.timeouts.connect).await?;
        upstream = Some(addr);
        let opts = worker.relay_opts(listener.splice);
        let (t, r) = crate::relay::run(&worker.relay, &stream, &up, &[], &[], opts).await;
        totals = t;
        r
    }
    .await;
    if worker.log.enabled() {
        let name = format!("relay://{target}");
        worker.log.log(&Entry {
            client: peer,
            method: b"RELAY",
            target: name.as_bytes(),
            status: 0,
            up: totals.up,
            down: totals.down,
            start,
            upstream,
            error: result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
        });
    }
    drop(guard);
}
