//! The TCP port relay (3proxy's tcppm, nginx's stream, haproxy's mode tcp): every
//! connection accepted on the listener is relayed to the listener's fixed target. With
//! `[listener.tls]` the relay terminates TLS from clients (stunnel's server mode); with
//! `[listener.target_tls]` it originates TLS to the target (stunnel's client mode).

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::accesslog::Entry;
use crate::acl::Protocol;
use crate::buf::{Buf, READ_SIZE};
use crate::config::Listener;
use crate::conn::Stream;
use crate::error::{ConnectError, Error, Phase};
use crate::exchange::{client_left, unless_left};
use crate::policy::Access;
use crate::tls::Session;
use crate::tunnel::{Handoff, Record};
use crate::worker::{ConnGuard, Worker};

pub async fn serve(guard: ConnGuard, listener: Arc<Listener>, stream: TcpStream, peer: SocketAddr) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let Some(target) = &listener.target else {
        // The configuration check makes this impossible; close rather than panic.
        return;
    };
    let name = format!("relay://{target}");
    let fail = |why: &dyn std::fmt::Display, upstream: Option<SocketAddr>, tls| {
        log_failure(&worker, peer, start, &name, upstream, why, tls)
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
    // What the client sends while the target is connected to goes first through the
    // relay (it owns no storage unless it is used).
    let mut early = Buf::default();
    let connected = match access.filter() {
        Ok(filter) => {
            // Boxed (every relay's future would otherwise grow by an attempt's state); a
            // client that leaves meanwhile ends the attempt.
            let connect = Box::pin(async {
                let (host, port) = (&target.host, target.port);
                worker.upstreams.connect(host, port, timeout, &filter).await.map_err(Error::Connect)
            });
            unless_left(&worker, connect, || {
                client_left(&mut client, &mut early, READ_SIZE, Phase::Connect, true)
            })
            .await
        }
        Err(d) => Err(Error::Connect(ConnectError::Denied(d))),
    };
    let connector = policy.tls_connector(listener.index).cloned();
    drop(policy);
    let (upstream, addr) = match connected {
        Ok(c) => c,
        Err(e) => return fail(&e, None, tls.as_deref()),
    };
    let upstream = match connector {
        None => Stream::Tcp(upstream),
        Some(config) => {
            let Some(t) = &listener.target_tls else { return };
            let timeout = worker.cfg.timeouts.handshake;
            // Ok with its own outcome, unless the client left.
            let handshake =
                Box::pin(async { Ok(originate(config, t, &target.host, upstream, timeout).await) });
            match unless_left(&worker, handshake, || {
                client_left(&mut client, &mut early, READ_SIZE, Phase::Connect, true)
            })
            .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(why)) => return fail(&why, Some(addr), tls.as_deref()),
                Err(e) => return fail(&e, Some(addr), tls.as_deref()),
            }
        }
    };
    let record = Record {
        tls,
        peer,
        label: crate::tunnel::Label::new(b"RELAY", name.as_bytes()),
        user: None,
        status: 0,
        start,
        upstream: Some(addr),
        up: 0,
        down: 0,
    };
    let handoff = Handoff {
        upstream,
        early_up: early.filled().to_vec(),
        early_down: Vec::new(),
        throttle: listener.throttle.clone(),
    };
    let opts = worker.relay_opts(listener.splice);
    crate::tunnel::spawn(guard, client, handoff, opts, record);
}

/// The client side: TLS terminated here when the listener has a certificate.
async fn accept_tls(
    worker: &Worker,
    listener: &Listener,
    mut stream: TcpStream,
) -> Result<(Stream, Option<Rc<Session>>), String> {
    let deadline = tokio::time::Instant::now() + worker.cfg.timeouts.handshake;
    let mut buf = worker.take_buf();
    let read = tokio::time::timeout_at(deadline, buf.read_from(&mut stream, crate::buf::READ_SIZE));
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

/// TLS towards the target: SNI and verification as configured; the error names what
/// verification found.
async fn originate(
    config: Arc<rustls::ClientConfig>,
    t: &crate::config::ConnectTls,
    host: &str,
    upstream: TcpStream,
    timeout: std::time::Duration,
) -> Result<Stream, String> {
    let name = crate::tls::server_name(t, host)?;
    let connect = crate::tls::connect(config, name, upstream, timeout);
    connect.await.map_err(|e| format!("TLS to the target failed: {e}"))
}

fn log_failure(
    worker: &Worker,
    peer: SocketAddr,
    start: Instant,
    target: &str,
    upstream: Option<SocketAddr>,
    why: &dyn std::fmt::Display,
    tls: Option<&Session>,
) {
    worker.log.log(&Entry {
        client: peer,
        method: b"RELAY",
        target: target.as_bytes(),
        status: 0,
        up: 0,
        down: 0,
        start,
        upstream,
        error: Some(why),
        user: None,
        tls,
    });
}
