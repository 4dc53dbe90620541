//! A connection's byte stream: plain TCP, or TLS over TCP (terminated from a client, or
//! originated towards an upstream). One enum rather than a type parameter everywhere, so
//! HTTP, tunnels and relays keep one code path each; the plain variant keeps splice(2)
//! available to them (`tcp()`), the TLS variants go through rustls.
//!
//! Writers must flush: a TLS stream may keep encrypted bytes it could not send yet until
//! the next write or flush (flushing a TCP stream costs nothing).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, TcpStream};

pub type ServerTls = tokio_rustls::server::TlsStream<TcpStream>;
pub type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;
pub type Ktls = ktls::KtlsStream<TcpStream>;

pub enum Stream {
    Tcp(TcpStream),
    /// TLS from a client (HTTPS proxy port, terminating relay). Boxed: the rustls state is
    /// large and plain connections should not pay for its size.
    Server(Box<ServerTls>),
    /// TLS towards an upstream (originating relay).
    Client(Box<ClientTls>),
    /// TLS either way whose records the kernel encrypts and decrypts (kTLS); the stream
    /// still reads through recvmsg so that alerts and other non-data records are seen.
    Kernel(Box<Ktls>),
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Self {
        Stream::Tcp(s)
    }
}

impl Stream {
    /// The socket, when bytes on it are the payload itself (splice can move them).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Server(_) | Stream::Client(_) | Stream::Kernel(_) => None,
        }
    }

    /// The TCP socket underneath, whatever runs over it.
    pub fn socket(&self) -> &TcpStream {
        match self {
            Stream::Tcp(s) => s,
            Stream::Server(s) => s.get_ref().0,
            Stream::Client(s) => s.get_ref().0,
            Stream::Kernel(s) => s.get_ref(),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket().local_addr()
    }

    pub fn is_tls(&self) -> bool {
        !matches!(self, Stream::Tcp(_))
    }

    /// Halves that can be used at once (a request body read while a response is
    /// written). Plain TCP splits for free; TLS shares one session between the halves.
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            other => {
                let (r, w) = tokio::io::split(other);
                (ReadHalf::Shared(r), WriteHalf::Shared(w))
            }
        }
    }
}

/// Gives splice(2) the socket behind a reader or writer when its bytes are the payload.
pub trait Splice {
    fn tcp(&self) -> Option<&TcpStream>;
}

impl Splice for tcp::ReadHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl Splice for tcp::WriteHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

pub enum ReadHalf<'a> {
    Tcp(tcp::ReadHalf<'a>),
    Shared(tokio::io::ReadHalf<&'a mut Stream>),
}

pub enum WriteHalf<'a> {
    Tcp(tcp::WriteHalf<'a>),
    Shared(tokio::io::WriteHalf<&'a mut Stream>),
}

impl Splice for ReadHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ReadHalf::Tcp(r) => Some(r.as_ref()),
            ReadHalf::Shared(_) => None,
        }
    }
}

impl Splice for WriteHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            WriteHalf::Tcp(w) => Some(w.as_ref()),
            WriteHalf::Shared(_) => None,
        }
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
            Stream::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
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
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Server(s) => s.is_write_vectored(),
            Stream::Client(s) => s.is_write_vectored(),
            Stream::Kernel(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for ReadHalf<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Shared(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Shared(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Shared(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Shared(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
