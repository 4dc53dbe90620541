//! TLS from clients: the HTTPS proxy port (`curl --proxy https://...`), the TLS branch of
//! `auto` ports, and the terminating side of TLS relays. The first bytes are read before
//! the handshake so that a plain-HTTP client on a TLS port gets a 400 that says so; those
//! bytes are then handed to rustls, so nothing is read twice.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::accesslog::Entry;
use crate::buf::Buf;
use crate::config::Listener;
use crate::conn::Stream;
use crate::worker::{ConnGuard, Worker};
use crate::tls::Session;

/// The first byte of a TLS record carrying a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;

/// How long the "this port expects TLS" answer may take to go out.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A TLS session with a client, and what it said about itself.
pub struct Accepted {
    pub stream: Stream,
    pub session: Rc<Session>,
    /// The user a verified client certificate names (listeners that map them).
    pub cert_user: Option<String>,
    /// The protocol ALPN chose.
    pub h2: bool,
}

/// An HTTPS proxy port connection.
pub async fn serve(
    guard: ConnGuard,
    listener: Arc<Listener>,
    mut stream: TcpStream,
    peer: SocketAddr,
) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + worker.cfg.timeouts.handshake;
    let mut buf = worker.take_buf();
    let read = tokio::time::timeout_at(deadline, buf.read_from(&mut stream, crate::buf::READ_SIZE));
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
        log_failure(&worker, peer, start, "not a TLS handshake on a TLS port");
        worker.give_buf(buf);
        return;
    }
    serve_prefixed(guard, listener, stream, peer, buf, deadline).await
}

/// Completes the handshake of a connection whose first bytes (a ClientHello) are in
/// `buf`, then serves HTTP inside. Also the `auto` port's TLS branch.
pub async fn serve_prefixed(
    guard: ConnGuard,
    listener: Arc<Listener>,
    stream: TcpStream,
    peer: SocketAddr,
    buf: Buf,
    deadline: tokio::time::Instant,
) {
    let worker = guard.worker().clone();
    let start = Instant::now();
    let accepted = accept(&worker, &listener, stream, buf, deadline).await;
    let Accepted { stream, session, cert_user, h2 } = match accepted {
        Ok(a) => a,
        Err(why) => {
            log_failure(&worker, peer, start, &why);
            return;
        }
    };
    if h2 {
        crate::http2::serve_tls(guard, listener, stream, peer, session, cert_user).await;
        return;
    }
    crate::http1::serve_tls(guard, listener, stream, peer, session, cert_user).await
}

/// The server side of a handshake whose first bytes were already read into `buf` (which
/// goes back to the worker's pool). With kernel TLS on, the session then goes to the
/// kernel.
pub async fn accept(
    worker: &Worker,
    listener: &Listener,
    stream: TcpStream,
    buf: Buf,
    deadline: tokio::time::Instant,
) -> Result<Accepted, String> {
    let policy = worker.policy();
    let Some(acceptor) = policy.tls_acceptor(listener.index) else {
        worker.give_buf(buf);
        return Err("a TLS ClientHello on a port without [listener.tls]".into());
    };
    let (config, how) = (acceptor.config.clone(), acceptor.client_user);
    drop(policy);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    if crate::tls::ktls() {
        let io = ktls::CorkStream::new(stream);
        let (tls, facts) = handshake(worker, &acceptor, io, buf, deadline, how).await?;
        let kernel = ktls::config_ktls_server(tls)
            .await
            .map_err(|e| format!("handing the session to kernel TLS failed: {e}"))?;
        return Ok(facts.with(Stream::Kernel(Box::new(kernel))));
    }
    let (tls, facts) = handshake(worker, &acceptor, stream, buf, deadline, how).await?;
    Ok(facts.with(Stream::Server(Box::new(tls))))
}

/// What a handshake said about the client, before its stream is wrapped.
struct Facts {
    session: Rc<Session>,
    cert_user: Option<String>,
    h2: bool,
}

impl Facts {
    fn with(self, stream: Stream) -> Accepted {
        Accepted { stream, session: self.session, cert_user: self.cert_user, h2: self.h2 }
    }
}

async fn handshake<IO>(
    worker: &Worker,
    acceptor: &tokio_rustls::TlsAcceptor,
    io: IO,
    buf: Buf,
    deadline: tokio::time::Instant,
    how: crate::config::CertUser,
) -> Result<(tokio_rustls::server::TlsStream<IO>, Facts), String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut fed = Ok(());
    let accept = acceptor.accept_with(io, |conn| {
        fed = feed(conn, buf.filled());
    });
    worker.give_buf(buf);
    let tls = match tokio::time::timeout_at(deadline, accept).await {
        Err(_) => return Err("TLS handshake timed out".into()),
        Ok(Err(e)) => {
            return Err(match fed {
                Err(first) => format!("TLS handshake failed: {first}"),
                Ok(()) => format!("TLS handshake failed: {e}"),
            })
        }
        Ok(Ok(s)) => s,
    };
    let conn = tls.get_ref().1;
    let facts = Facts {
        session: Rc::new(Session::of(conn, conn.server_name())),
        cert_user: crate::tls::cert_user(conn, how),
        h2: conn.alpn_protocol() == Some(b"h2"),
    };
    Ok((tls, facts))
}

/// Hands bytes already read from the socket to rustls and processes them, so that the
/// handshake answers them without waiting for more from the client.
fn feed(conn: &mut rustls::ServerConnection, mut bytes: &[u8]) -> Result<(), rustls::Error> {
    while !bytes.is_empty() {
        match conn.read_tls(&mut bytes) {
            Ok(0) => break,
            Ok(_) => {
                conn.process_new_packets()?;
            }
            Err(e) => return Err(rustls::Error::General(e.to_string())),
        }
    }
    Ok(())
}

fn log_failure(worker: &Worker, peer: SocketAddr, start: Instant, why: &str) {
    worker.log.log(&Entry {
        client: peer,
        method: b"-",
        target: b"-",
        status: 0,
        up: 0,
        down: 0,
        start,
        upstream: None,
        error: Some(&why),
        user: None,
        tls: None,
    });
}
