//! Opening a connection for a lane: plain TCP to the origin or the proxy,
//! then (per mode) a CONNECT tunnel, a SOCKS5 tunnel or a TLS session.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::plan::{Hop, Plan};
use super::response::{Expect, Reader};
use super::stats::ErrorKind;

/// A lane's connection: enum dispatch instead of a boxed trait object, so
/// the plain-TCP hot path costs one match per poll.
pub(crate) enum Stream {
    Tcp(TcpStream),
    // Boxed: the TLS state is large and rarely used.
    Tls(Box<TlsStream<TcpStream>>),
}

/// Opens a connection ready for HTTP (or the WebSocket upgrade). `reader`
/// is reset and then used for the proxy's handshake answers; whatever the
/// proxy sent past its answer stays buffered for the first response.
pub(crate) async fn dial(plan: &Plan, reader: &mut Reader) -> Result<Stream, ErrorKind> {
    reader.reset();
    match &plan.hop {
        Hop::Direct(addr) => Ok(Stream::Tcp(tcp(*addr).await?)),
        Hop::Connect { proxy, request } => {
            let mut s = tcp(*proxy).await?;
            s.write_all(request).await.map_err(|_| ErrorKind::Write)?;
            let resp = reader.response(&mut s, Expect::Tunnel).await?;
            // A 2xx turns the connection into the tunnel whatever its version
            // or Connection header say (RFC 9110 9.3.6): tinyproxy answers
            // `HTTP/1.0 200`, which would otherwise read as closing.
            if !(200..300).contains(&resp.status) {
                return Err(ErrorKind::ProxyRefused);
            }
            Ok(Stream::Tcp(s))
        }
        Hop::Socks5 { proxy, auth, request } => {
            let mut s = tcp(*proxy).await?;
            socks5(&mut s, reader, auth.as_deref(), request).await?;
            Ok(Stream::Tcp(s))
        }
        Hop::Tls { proxy, connector, name } => {
            let s = tcp(*proxy).await?;
            // A failed handshake means the hop could not be set up: a connect error.
            let tls = connector.connect(name.clone(), s).await.map_err(|_| ErrorKind::Connect)?;
            Ok(Stream::Tls(Box::new(tls)))
        }
    }
}

pub(crate) async fn tcp(addr: SocketAddr) -> Result<TcpStream, ErrorKind> {
    let s = TcpStream::connect(addr).await.map_err(|_| ErrorKind::Connect)?;
    // Requests go out in one write; no reason to let Nagle hold anything.
    s.set_nodelay(true).map_err(|_| ErrorKind::Connect)?;
    Ok(s)
}

/// RFC 1928 greeting offering no-auth (or, with `auth`, user/password only,
/// then the RFC 1929 exchange), then CONNECT. Each step waits for its answer
/// (no optimistic pipelining), as strict proxies require.
async fn socks5(
    s: &mut TcpStream,
    reader: &mut Reader,
    auth: Option<&[u8]>,
    request: &[u8],
) -> Result<(), ErrorKind> {
    let method = if auth.is_some() { 2 } else { 0 };
    s.write_all(&[5, 1, method]).await.map_err(|_| ErrorKind::Write)?;
    reader.need(s, 2).await?;
    let b = reader.buffered();
    let chosen = [b[0], b[1]];
    reader.advance(2);
    match chosen {
        [5, m] if m == method => {}
        [5, _] => return Err(ErrorKind::ProxyRefused),
        _ => return Err(ErrorKind::Parse),
    }
    if let Some(auth) = auth {
        s.write_all(auth).await.map_err(|_| ErrorKind::Write)?;
        // VER STATUS: status 0 is success.
        reader.need(s, 2).await?;
        let status = reader.buffered()[1];
        reader.advance(2);
        if status != 0 {
            return Err(ErrorKind::ProxyRefused);
        }
    }
    s.write_all(request).await.map_err(|_| ErrorKind::Write)?;
    // VER REP RSV ATYP, then the bound address and port.
    reader.need(s, 5).await?;
    let b = reader.buffered();
    let (ver, rep, atyp, b4) = (b[0], b[1], b[3], b[4]);
    if ver != 5 {
        return Err(ErrorKind::Parse);
    }
    if rep != 0 {
        return Err(ErrorKind::ProxyRefused);
    }
    let addr_len = match atyp {
        1 => 4,
        4 => 16,
        3 => 1 + usize::from(b4),
        _ => return Err(ErrorKind::Parse),
    };
    let total = 4 + addr_len + 2;
    reader.need(s, total).await?;
    reader.advance(total);
    Ok(())
}

impl Stream {
    /// Sends TLS's close_notify (on a TLS stream; nothing on plain TCP,
    /// whose close says it all).
    pub(crate) async fn close_notify(&mut self) {
        if let Stream::Tls(s) = self {
            let _ = s.shutdown().await;
        }
    }

    /// Polls a read once, without waiting: is the connection still open?
    /// Pending (nothing to read) or data means open; EOF or error, closed.
    pub(crate) async fn is_open(&mut self) -> bool {
        std::future::poll_fn(|cx| {
            let mut byte = [0u8; 1];
            let mut buf = ReadBuf::new(&mut byte);
            Poll::Ready(match Pin::new(&mut *self).poll_read(cx, &mut buf) {
                Poll::Pending => true,
                Poll::Ready(Ok(())) => !buf.filled().is_empty(),
                Poll::Ready(Err(_)) => false,
            })
        })
        .await
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
