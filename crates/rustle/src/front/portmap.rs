//! The TCP port relay (3proxy's tcppm, nginx's stream, haproxy's mode tcp): every
//! connection accepted on the listener is relayed to the listener's fixed target. With
//! `[listener.tls]` the relay terminates TLS from clients (stunnel's server mode); with
//! `[listener.target_tls]` it originates TLS to the target (stunnel's client mode).

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::error::{ConnectError, Error, Phase};
use crate::front::exchange::{client_left, connect};
use crate::front::tunnel::Handoff;
use crate::front::worker::{ConnGuard, Worker};
use crate::io::buf::{Buf, READ_SIZE};
use crate::io::conn::Stream;
use crate::io::tls::Session;
use crate::policy::Listener;
use crate::telemetry::accesslog::{Label, Parts, Protocol, Record};
use crate::upstream::{Connected, Tls, Want};

pub(crate) async fn serve(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let Some(target) = &listener.target else {
        // The configuration check makes this impossible; close rather than panic.
        return;
    };
    let name = format!("relay://{target}");
    let fail = |why: &dyn std::fmt::Display, upstream: Option<SocketAddr>, tls| {
        log_failure(&worker, &listener, peer, start, &name, upstream, why, tls, None)
    };
    // The address the client connected to, for a PROXY protocol header to the target.
    let local = match listener.target_proxy_protocol {
        Some(_) => stream.local_addr().ok(),
        None => None,
    };
    // Boxed: the handshake's state would otherwise make every plain relay's future
    // larger; a TLS handshake costs far more than one allocation.
    let accepted = match listener.tls.is_some() {
        true => Box::pin(accept_tls(&worker, &listener, stream)).await,
        false => Ok((Stream::Tcp(stream), None)),
    };
    let (mut client, tls) = match accepted {
        Ok(accepted) => accepted,
        Err(why) => return fail(&why, None, None),
    };
    let policy = worker.policy();
    let tls_to_target = match (&listener.target_tls, policy.tls_connector(&listener.key)) {
        // A PROXY protocol header goes in clear before the handshake (as haproxy's
        // `send-proxy-v2 ssl`), written by `upstream::target_tls`.
        (Some(_), Some(_)) => Tls::Relay { listener: &listener.config },
        _ => Tls::Plain,
    };
    let want_tls_plain = matches!(tls_to_target, Tls::Plain);
    let want = Want {
        host: &target.host,
        port: target.port,
        protocol: Protocol::Relay,
        client: peer.ip(),
        addrs: (&peer, local.as_ref().unwrap_or(&listener.listen)),
        user: None,
        listener: listener.name.as_deref(),
        tls: tls_to_target,
        local: crate::upstream::local_of(&policy, || client.local_addr()),
        params: None,
        seed: None,
    };
    // What the client sends while the target is connected to goes first through the
    // relay (it owns no storage unless it is used).
    let mut early = Buf::default();
    let connected = connect(&worker, &policy, &want, None, || {
        client_left(&mut client, &mut early, READ_SIZE, Phase::Connect, true)
    })
    .await;
    drop(policy);
    let Connected { stream: upstream, addr, early: early_down, via, .. } = match connected {
        Ok(c) => c,
        Err(e) => {
            let addr = match &e {
                Error::Connect(ConnectError::Tls { addr, .. }) => Some(*addr),
                _ => None,
            };
            return log_failure(
                &worker,
                &listener,
                peer,
                start,
                &name,
                addr,
                &e,
                tls.as_deref(),
                Some(&e),
            );
        }
    };
    let record = crate::front::tunnel::Record {
        tls,
        peer,
        label: {
            let mut label = Label::new([b"RELAY", name.as_bytes(), b"", b""]);
            label.protocol = Protocol::Relay;
            label
        },
        user: None,
        status: 0,
        start,
        upstream: Some(addr),
        via,
        up: 0,
        down: 0,
    };
    let mut early_up = Vec::new();
    if let (Some(version), true) = (listener.target_proxy_protocol, want_tls_plain) {
        // Before anything of the client's: the first bytes the target reads (with
        // `target_tls`, `upstream::target_tls` wrote it before the handshake).
        let addrs = local.map(|local| (peer, local));
        match version {
            crate::config::ProxyProtocol::V1 => {
                rustle_proto::proxy_protocol::write_v1(addrs, &mut early_up)
            }
            _ => rustle_proto::proxy_protocol::write_v2(addrs, &mut early_up),
        }
    }
    early_up.extend_from_slice(early.filled());
    let handoff = Handoff {
        upstream,
        early_up,
        early_down,
        throttle: listener.throttle.clone(),
        traffic: None,
    };
    let opts = worker.relay_opts(listener.splice);
    crate::front::tunnel::spawn(guard, client, handoff, opts, record);
}

/// The client side: TLS terminated here when the listener has a certificate.
async fn accept_tls(
    worker: &Worker,
    listener: &Listener,
    mut stream: TcpStream,
) -> Result<(Stream, Option<Rc<Session>>), String> {
    let deadline = worker.handshake_deadline();
    let mut buf = worker.take_buf();
    let read =
        tokio::time::timeout_at(deadline, buf.read_from(&mut stream, crate::io::buf::READ_SIZE));
    let first = match read.await {
        Ok(Ok(n)) if n > 0 => buf.filled()[0],
        Ok(Ok(_)) | Ok(Err(_)) => 0,
        Err(_) => {
            worker.give_buf(buf);
            return Err("TLS handshake timed out".into());
        }
    };
    if first != 0x16 {
        worker.give_buf(buf);
        return Err("not a TLS handshake on a TLS relay".into());
    }
    let accepted = worker.accept_tls(listener, stream, buf, deadline).await?;
    Ok((accepted.stream, Some(accepted.session)))
}

/// A relay connection that failed before its tunnel: counted, and its log line. `error`:
/// the failure as an error, when it is one (a TLS handshake's is only text).
#[allow(clippy::too_many_arguments)]
fn log_failure(
    worker: &Worker,
    listener: &Listener,
    peer: SocketAddr,
    start: Instant,
    target: &str,
    upstream: Option<SocketAddr>,
    why: &dyn std::fmt::Display,
    tls: Option<&Session>,
    error: Option<&Error>,
) {
    let parts = Parts { method: b"RELAY", target: target.as_bytes() };
    let mut record = Record::new(peer, listener, &listener.counters, Protocol::Relay, start);
    record.label = &parts;
    (record.upstream, record.tls, record.error) = (upstream, tls, Some(why));
    crate::front::exchange::end(worker, None, record, error);
}
