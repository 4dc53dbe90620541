//! From an accepted connection to its front end, for the listeners that can carry more
//! than one protocol: an HTTP port (HTTP/1.1, or HTTP/2 with prior knowledge), an HTTPS
//! proxy port (HTTP/1.1 or HTTP/2 as ALPN chose) and an `auto` port (HTTP, SOCKS4/5 or TLS
//! by the first byte). On a TLS port the first bytes are read before the handshake, so
//! that a plain-HTTP client gets a 400 that says so; those bytes are then handed to rustls,
//! so nothing is read twice. Front ends never call each other: they are chosen here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustle_proto::detect::{detect, Protocol as Detected};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::front::worker::{ConnGuard, Worker};
use crate::io::buf::Buf;
use crate::io::conn::Stream;
use crate::policy::Listener;
use crate::telemetry::accesslog::{Protocol, Record};

/// The first byte of a TLS record carrying a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;

/// How long the "this port expects TLS" answer may take to go out.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// An HTTPS proxy port connection.
pub(crate) async fn serve_https(
    guard: ConnGuard,
    listener: Arc<Listener>,
    mut stream: TcpStream,
    peer: SocketAddr,
) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let deadline = worker.handshake_deadline();
    let mut buf = worker.take_buf();
    let read =
        tokio::time::timeout_at(deadline, buf.read_from(&mut stream, crate::io::buf::READ_SIZE));
    match read.await {
        Ok(Ok(n)) if n > 0 => {}
        // Closed, failed or silent before the handshake: nothing to answer.
        _ => {
            worker.give_buf(buf);
            return;
        }
    }
    if buf.filled()[0] != TLS_HANDSHAKE {
        if buf.filled()[0].is_ascii_uppercase() {
            // A plain HTTP request: it cannot be read as TLS, but it can be answered.
            let body = "this port expects TLS: use an https:// proxy URL\n";
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let write = stream.write_all(answer.as_bytes());
            if let Ok(Ok(())) = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await {
                let _ = stream.shutdown().await;
            }
        }
        log_failure(&worker, &listener, peer, start, "not a TLS handshake on a TLS port");
        worker.give_buf(buf);
        return;
    }
    serve_prefixed(guard, listener, stream, peer, buf, deadline).await
}

/// Completes the handshake of a connection whose first bytes (a ClientHello) are in
/// `buf`, then serves HTTP inside. Also the `auto` port's TLS branch.
pub(crate) async fn serve_prefixed(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: TcpStream,
    peer: SocketAddr,
    buf: Buf,
    deadline: tokio::time::Instant,
) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let accepted = worker.accept_tls(&listener, stream, buf, deadline).await;
    let crate::io::tls::Accepted { stream, session, cert_user, h2 } = match accepted {
        Ok(a) => a,
        Err(why) => {
            log_failure(&worker, &listener, peer, start, &why);
            return;
        }
    };
    if h2 {
        let local = crate::upstream::local_of(&worker.policy(), || stream.local_addr());
        let peer = (peer, local);
        let fd = stream.raw_fd();
        crate::front::http2::serve_tls(guard, listener, stream, fd, peer, session, cert_user).await;
        return;
    }
    crate::front::http1::serve_tls(guard, listener, stream, peer, session, cert_user).await;
}

/// A listener detecting the protocol from the first byte: HTTP goes to `http1`, SOCKS
/// stays here. Detection reads into the buffer the chosen protocol then parses, so it
/// costs HTTP nothing beyond one branch.
pub(crate) async fn serve_auto(
    guard: ConnGuard,
    listener: Arc<Listener>,
    mut stream: crate::io::conn::Stream,
    peer: SocketAddr,
) {
    let worker = guard.worker().clone();
    let mut buf = worker.take_buf();
    let deadline = tokio::time::Instant::now() + worker.cfg().timeouts.header;
    let protocol = loop {
        match detect(buf.filled()) {
            Ok(Some(p)) => break p,
            Ok(None) => {}
            Err(e) => {
                log_failure(&worker, &listener, peer, Instant::now(), &format!("{e}"));
                worker.give_buf(buf);
                return;
            }
        }
        match tokio::time::timeout_at(
            deadline,
            buf.read_from(&mut stream, crate::io::buf::READ_SIZE),
        )
        .await
        {
            Ok(Ok(n)) if n > 0 => {}
            // Closed, failed or silent before saying anything: nothing to answer.
            _ => {
                worker.give_buf(buf);
                return;
            }
        }
    };
    if protocol == Detected::Http {
        // HTTP keeps a fresh socket unregistered until it must wait.
        return serve_http(guard, listener, stream, peer, buf).await;
    }
    let stream = match stream.into_tcp() {
        Ok(s) => s,
        Err(e) => {
            log_failure(
                &worker,
                &listener,
                peer,
                Instant::now(),
                &format!("cannot register the connection: {e}"),
            );
            worker.give_buf(buf);
            return;
        }
    };
    match protocol {
        Detected::Http => {}
        Detected::Socks4 | Detected::Socks5 => {
            crate::front::socks::serve(guard, listener, stream, peer, buf).await
        }
        Detected::Tls => {
            // HTTP inside TLS, when the listener has a certificate.
            let deadline = tokio::time::Instant::now() + worker.cfg().timeouts.handshake;
            serve_prefixed(guard, listener, stream, peer, buf, deadline).await
        }
    }
}

/// Over a connection limit on an `auto` listener: an HTTP client gets its 503, anything
/// else (SOCKS has no reply before the greeting) is closed.
pub(crate) async fn refuse_auto(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let mut first = [0u8; 1];
    let wait = guard.worker().cfg().timeouts.header;
    if let Ok(Ok(1)) = tokio::time::timeout(wait, stream.peek(&mut first)).await {
        if let Ok(Some(Detected::Http)) = detect(&first) {
            crate::front::http1::refuse_overloaded(guard, listener, stream.into(), peer).await;
            return;
        }
    }
    crate::telemetry::metrics::refused(
        &listener.counters,
        crate::telemetry::metrics::Refused::Limit,
    );
    log_failure(guard.worker(), &listener, peer, Instant::now(), "too many connections");
}

/// The one line of a connection refused before a request was read.
pub(crate) fn log_failure(
    worker: &Worker,
    listener: &Listener,
    peer: SocketAddr,
    start: Instant,
    why: &str,
) {
    let mut record = Record::new(peer, listener, &listener.counters, Protocol::Unknown, start);
    record.error = Some(&why);
    crate::front::exchange::end(worker, None, record, None);
}

/// Serves a plain HTTP proxy connection (`Stream::Fresh` from the accept loop: it is
/// registered with the event loop only once a read or write would block) whose first
/// bytes may already be in `buf`. A connection that opens with the HTTP/2 preface on a
/// listener with `h2c` goes on as HTTP/2, in a task of its own, so that this future does
/// not grow by an HTTP/2 connection.
pub(crate) fn serve_http(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: Stream,
    peer: SocketAddr,
    buf: Buf,
) -> impl std::future::Future<Output = ()> {
    // A plain function, not an `async fn`: a wrapper's own copy of the arguments would
    // stay in every HTTP connection's future.
    crate::front::http1::serve_buffered(guard, listener, stream, peer, buf, h2c)
}

/// An h2c connection handed back by HTTP/1 goes on as HTTP/2 in a task of its own.
fn h2c(c: crate::front::http1::H2c) {
    let crate::front::http1::H2c { guard, listener, stream, peer, buf } = c;
    let local = crate::upstream::local_of(&guard.worker().policy(), || stream.local_addr());
    let fd = stream.raw_fd();
    drop(tokio::task::spawn_local(crate::front::http2::serve_rewound(
        guard,
        listener,
        stream,
        fd,
        (peer, local),
        buf,
    )));
}

/// `serve_http` for a connection fresh from the accept loop (a plain function, so that
/// the connection's future is `serve_http`'s and no bigger).
pub(crate) fn serve_fresh(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: Stream,
    peer: SocketAddr,
) -> impl std::future::Future<Output = ()> {
    let buf = guard.worker().take_buf();
    serve_http(guard, listener, stream, peer, buf)
}
