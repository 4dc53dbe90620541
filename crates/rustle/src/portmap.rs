//! The TCP port relay (3proxy's tcppm, nginx's stream, haproxy's mode tcp): every
//! connection accepted on the listener is relayed to the listener's fixed target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::accesslog::Entry;
use crate::acl::Protocol;
use crate::config::Listener;
use crate::error::ConnectError;
use crate::policy::Access;
use crate::server::ConnGuard;
use crate::tunnel::{Handoff, Record};

pub async fn serve(guard: ConnGuard, listener: Arc<Listener>, stream: TcpStream, peer: SocketAddr) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let Some(target) = &listener.target else {
        // The configuration check makes this impossible; close rather than panic.
        return;
    };
    let name = format!("relay://{target}");
    let timeout = worker.cfg.timeouts.connect;
    let policy = worker.policy();
    let access = Access {
        policy: &policy,
        listener: listener.name.as_deref(),
        client: peer.ip(),
        user: None,
        host: &target.host,
        port: target.port,
        protocol: Protocol::Relay,
    };
    let connected = match access.filter() {
        Ok(filter) => worker.upstreams.connect(&target.host, target.port, timeout, &filter).await,
        Err(d) => Err(ConnectError::Denied(d)),
    };
    match connected {
        Ok((upstream, addr)) => {
            let record = Record {
                peer,
                method: b"RELAY".to_vec(),
                user: None,
                target: name.into_bytes(),
                status: 0,
                start,
                upstream: Some(addr),
                up: 0,
                down: 0,
            };
            let handoff = Handoff {
                upstream: upstream.into(),
                early_up: Vec::new(),
                early_down: Vec::new(),
                throttle: listener.throttle.clone(),
            };
            let opts = worker.relay_opts(listener.splice);
            crate::tunnel::spawn(guard, stream.into(), handoff, opts, record);
        }
        Err(e) => worker.log.log(&Entry {
            client: peer,
            method: b"RELAY",
            target: name.as_bytes(),
            status: 0,
            up: 0,
            down: 0,
            start,
            upstream: None,
            error: Some(&e),
            user: None,
        }),
    }
}
