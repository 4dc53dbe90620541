//! The server side of TLS handshakes with clients (HTTPS proxy ports, TLS on `auto` ports,
//! terminating relays), fed the bytes already read so that nothing is read twice.

use std::rc::Rc;

use tokio::net::TcpStream;

use super::{Acceptor, Session};
use crate::io::buf::Buf;
use crate::io::conn::Stream;

/// A TLS session with a client, and what it said about itself.
pub(crate) struct Accepted {
    pub(crate) stream: Stream,
    pub(crate) session: Rc<Session>,
    /// The user a verified client certificate names (listeners that map them).
    pub(crate) cert_user: Option<String>,
    /// The protocol ALPN chose.
    pub(crate) h2: bool,
}

/// The server side of a handshake whose first bytes were already read into `buf`, which
/// goes to `give_back` as soon as rustls has taken them. With kernel TLS on, the session
/// then goes to the kernel.
pub(crate) async fn accept(
    acceptor: &Acceptor,
    stream: TcpStream,
    buf: Buf,
    give_back: impl FnOnce(Buf),
    deadline: tokio::time::Instant,
) -> Result<Accepted, String> {
    let (config, how) = (acceptor.config.clone(), acceptor.client_user);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    #[cfg(feature = "ktls")]
    if super::ktls() {
        let io = ktls::CorkStream::new(stream);
        let (tls, facts) = handshake(&acceptor, io, buf, give_back, deadline, how).await?;
        let kernel = ktls::config_ktls_server(tls)
            .await
            .map_err(|e| format!("handing the session to kernel TLS failed: {e}"))?;
        return Ok(facts.with(Stream::Kernel(Box::new(kernel))));
    }
    let (tls, facts) = handshake(&acceptor, stream, buf, give_back, deadline, how).await?;
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
    acceptor: &tokio_rustls::TlsAcceptor,
    io: IO,
    buf: Buf,
    give_back: impl FnOnce(Buf),
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
    give_back(buf);
    if let Err(first) = fed {
        // The bytes in hand are refused already: one poll sends the alert, and the
        // connection closes (and its line is logged) now, not at the handshake deadline.
        let _ = crate::io::idle::poll_once(std::pin::pin!(accept)).await;
        return Err(format!("TLS handshake failed: {first}"));
    }
    let tls = match tokio::time::timeout_at(deadline, accept).await {
        Err(_) => return Err("TLS handshake timed out".into()),
        Ok(Err(e)) => return Err(format!("TLS handshake failed: {e}")),
        Ok(Ok(s)) => s,
    };
    let conn = tls.get_ref().1;
    let facts = Facts {
        session: Rc::new(Session::of(conn, conn.server_name())),
        cert_user: super::cert_user(conn, how),
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
