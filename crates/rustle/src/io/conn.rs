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

pub(crate) type ServerTls = tokio_rustls::server::TlsStream<TcpStream>;
pub(crate) type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;
#[cfg(feature = "ktls")]
pub(crate) type Ktls = ktls::KtlsStream<TcpStream>;
pub(crate) type NestedTls = tokio_rustls::client::TlsStream<Stream>;

pub(crate) enum Stream {
    Tcp(TcpStream),
    /// A plain client connection not yet registered with the event loop (non-blocking).
    /// Reads and writes are tried directly; the first one that would block registers the
    /// socket and the stream becomes `Tcp`. A `Connection: close` exchange whose request
    /// is already there when it is accepted and whose answer fits the send buffer never
    /// registers at all, which saves the two epoll_ctl calls and the readiness round of
    /// every new connection.
    /// (None only after a registration failed: every operation then fails.)
    Fresh(Option<std::net::TcpStream>),
    /// TLS from a client (HTTPS proxy port, terminating relay). Boxed: the rustls state is
    /// large and plain connections should not pay for its size.
    Server(Box<ServerTls>),
    /// TLS towards an upstream (originating relay).
    Client(Box<ClientTls>),
    /// TLS either way whose records the kernel encrypts and decrypts (kTLS); the stream
    /// still reads through recvmsg so that alerts and other non-data records are seen.
    #[cfg(feature = "ktls")]
    Kernel(Box<Ktls>),
    /// TLS inside a stream that is not plain TCP: towards an origin or a parent proxy
    /// reached through a TLS connection to another parent.
    Nested(Box<NestedTls>),
}

fn unregistered() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "socket could not be registered")
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Self {
        Stream::Tcp(s)
    }
}

impl Stream {
    /// The socket, when bytes on it are the payload itself (splice can move them).
    /// (None for a `Fresh` stream: `register` it first.)
    pub(crate) fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Fresh(_) | Stream::Server(_) | Stream::Client(_) | Stream::Nested(_) => None,
            #[cfg(feature = "ktls")]
            Stream::Kernel(_) => None,
        }
    }

    /// The registered TCP socket underneath, whatever runs over it (None while `Fresh`).
    pub(crate) fn socket(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Fresh(_) => None,
            Stream::Server(s) => Some(s.get_ref().0),
            Stream::Client(s) => Some(s.get_ref().0),
            #[cfg(feature = "ktls")]
            Stream::Kernel(s) => Some(s.get_ref()),
            Stream::Nested(s) => s.get_ref().0.socket(),
        }
    }

    /// The client socket's descriptor, whatever runs over it (-1 after a failed
    /// registration): what cutting a user's connections shuts down.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd as _;
        match (self, self.socket()) {
            (Stream::Fresh(Some(s)), _) => s.as_raw_fd(),
            (_, Some(s)) => s.as_raw_fd(),
            (_, None) => -1,
        }
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        match (self, self.socket()) {
            (Stream::Fresh(Some(s)), _) => s.local_addr(),
            (_, Some(s)) => s.local_addr(),
            (_, None) => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    pub(crate) fn is_tls(&self) -> bool {
        !matches!(self, Stream::Tcp(_) | Stream::Fresh(_))
    }

    /// Ends a TLS session that is dropped without anything to wait for (an idle pooled
    /// origin connection, one that cannot be reused): close_notify and FIN go out now if
    /// the socket has room for them (it nearly always has), else the close goes without.
    /// Nothing for plain TCP, whose close says all.
    pub(crate) fn close_now(&mut self) {
        if self.is_tls() {
            shutdown_now(self);
        }
    }

    /// Makes closing a plain TCP stream a reset (SO_LINGER 0): for an answer whose end
    /// is the connection's end, cut short, so that the client does not take the cut for
    /// the end. Nothing for TLS, whose missing close_notify already says it.
    pub(crate) fn reset_on_close(&self) {
        let res = match self {
            Stream::Tcp(s) => socket2::SockRef::from(s).set_linger(Some(std::time::Duration::ZERO)),
            Stream::Fresh(Some(s)) => {
                socket2::SockRef::from(s).set_linger(Some(std::time::Duration::ZERO))
            }
            Stream::Fresh(None) | Stream::Server(_) | Stream::Client(_) | Stream::Nested(_) => {
                Ok(())
            }
            #[cfg(feature = "ktls")]
            Stream::Kernel(_) => Ok(()),
        };
        if let Err(e) = res {
            tracing::debug!("SO_LINGER 0 on a cut connection: {e}");
        }
    }

    /// Registers a `Fresh` socket with the event loop (it becomes `Tcp`); other streams
    /// are left as they are.
    pub(crate) fn register(&mut self) -> io::Result<()> {
        let Stream::Fresh(fresh) = self else { return Ok(()) };
        let s = fresh.take().ok_or_else(unregistered)?;
        *self = Stream::Tcp(TcpStream::from_std(s)?);
        Ok(())
    }

    /// The plain socket, registered (a `Fresh` one is registered now); an error for TLS.
    pub(crate) fn into_tcp(mut self) -> io::Result<TcpStream> {
        self.register()?;
        match self {
            Stream::Tcp(s) => Ok(s),
            _ => Err(io::Error::other("not a plain TCP stream")),
        }
    }

    /// One try of `op` on a fresh socket: its result, or None when it would block (the
    /// socket is then registered and `self` is `Tcp`, to be polled the usual way).
    fn try_fresh<T>(
        &mut self,
        mut op: impl FnMut(&std::net::TcpStream) -> io::Result<T>,
    ) -> Option<io::Result<T>> {
        let Stream::Fresh(Some(s)) = self else { return Some(Err(unregistered())) };
        loop {
            match op(s) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                r => return Some(r),
            }
        }
        match self.register() {
            Ok(()) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Halves for one exchange: `read` says whether the read half will be used (a request
    /// body to stream). Without it the write half is the whole stream, which keeps a
    /// `Fresh` socket unregistered; with it, `split`.
    pub(crate) fn halves(&mut self, read: bool) -> (ReadHalf<'_>, WriteHalf<'_>) {
        match self {
            Stream::Fresh(_) if !read => (ReadHalf::Unused, WriteHalf::Whole(self)),
            _ => self.split(),
        }
    }

    /// Halves that can be used at once (a request body read while a response is
    /// written). Plain TCP splits for free; TLS shares one session between the halves.
    pub(crate) fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        // A fresh socket that cannot be registered still works through the shared halves
        // (each operation then reports the error).
        let _ = self.register();
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

/// One try at shutting a writer down (for a TLS stream: close_notify, then FIN), for
/// when nothing can be waited for: whatever would block is given up.
pub(crate) fn shutdown_now<W: AsyncWrite + Unpin + ?Sized>(w: &mut W) {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let _ = Pin::new(w).poll_shutdown(&mut cx);
}

/// Gives splice(2) the socket behind a reader or writer when its bytes are the payload.
pub(crate) trait Splice {
    fn tcp(&self) -> Option<&TcpStream>;

    /// A large body is about to go through: make the socket spliceable if it can be (a
    /// `Fresh` stream is registered). Nothing to do for most.
    fn prepare_splice(&mut self) {}
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

pub(crate) enum ReadHalf<'a> {
    Tcp(tcp::ReadHalf<'a>),
    Shared(tokio::io::ReadHalf<&'a mut Stream>),
    /// The read half of `halves(false)`: never to be read (reading fails).
    Unused,
}

pub(crate) enum WriteHalf<'a> {
    Tcp(tcp::WriteHalf<'a>),
    Shared(tokio::io::WriteHalf<&'a mut Stream>),
    /// The whole stream, when nothing is read meanwhile (`halves(false)`): a fresh socket
    /// stays unregistered unless a write would block.
    Whole(&'a mut Stream),
}

impl Splice for ReadHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ReadHalf::Tcp(r) => Some(r.as_ref()),
            ReadHalf::Shared(_) | ReadHalf::Unused => None,
        }
    }
}

impl Splice for WriteHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            WriteHalf::Tcp(w) => Some(w.as_ref()),
            WriteHalf::Shared(_) => None,
            WriteHalf::Whole(s) => s.tcp(),
        }
    }

    fn prepare_splice(&mut self) {
        if let WriteHalf::Whole(s) = self {
            // Failure shows on the next write; copying goes on meanwhile.
            let _ = s.register();
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Stream::Fresh(_) = this {
            let dst = buf.initialize_unfilled();
            match this.try_fresh(|mut s| io::Read::read(&mut s, dst)) {
                Some(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => {}
            }
        }
        match this {
            Stream::Fresh(_) => Poll::Ready(Err(unregistered())),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            #[cfg(feature = "ktls")]
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Nested(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Stream::Fresh(_) = this {
            if let Some(r) = this.try_fresh(|mut s| io::Write::write(&mut s, buf)) {
                return Poll::Ready(r);
            }
        }
        match this {
            Stream::Fresh(_) => Poll::Ready(Err(unregistered())),
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            #[cfg(feature = "ktls")]
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Nested(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Stream::Fresh(_) = this {
            if let Some(r) = this.try_fresh(|mut s| io::Write::write_vectored(&mut s, bufs)) {
                return Poll::Ready(r);
            }
        }
        match this {
            Stream::Fresh(_) => Poll::Ready(Err(unregistered())),
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            #[cfg(feature = "ktls")]
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Nested(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Fresh(_) => true,
            Stream::Server(s) => s.is_write_vectored(),
            Stream::Client(s) => s.is_write_vectored(),
            #[cfg(feature = "ktls")]
            Stream::Kernel(s) => s.is_write_vectored(),
            Stream::Nested(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Fresh(_) => Poll::Ready(Ok(())),
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
            #[cfg(feature = "ktls")]
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Nested(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Fresh(Some(s)) => Poll::Ready(s.shutdown(std::net::Shutdown::Write)),
            Stream::Fresh(None) => Poll::Ready(Err(unregistered())),
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            #[cfg(feature = "ktls")]
            Stream::Kernel(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Nested(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
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
            ReadHalf::Unused => Poll::Ready(Err(io::Error::other("read half not taken"))),
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
            WriteHalf::Whole(w) => Pin::new(&mut **w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Shared(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Whole(w) => Pin::new(&mut **w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Shared(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Whole(w) => Pin::new(&mut **w).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future as _;
    use std::io::Write as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn fresh_pair() -> (Stream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("test socket");
        let client = std::net::TcpStream::connect(l.local_addr().expect("test socket"))
            .expect("test socket");
        let (s, _) = l.accept().expect("test socket");
        s.set_nonblocking(true).expect("test socket");
        (Stream::Fresh(Some(s)), client)
    }

    /// A fresh socket is read and written without registering while nothing blocks; the
    /// first read that would block registers it, and it then waits like any other.
    #[tokio::test]
    async fn fresh_stream_registers_only_when_a_read_would_block() {
        let (mut s, mut client) = fresh_pair();
        client.write_all(b"GET").expect("test socket");
        let mut buf = [0u8; 16];
        // The bytes may take a moment to arrive on loopback: a read that finds nothing
        // registers, and the wait ends when they come.
        let n = s.read(&mut buf).await.expect("test socket");
        assert_eq!(&buf[..n], b"GET");
        s.write_all(b"answer").await.expect("test socket");
        let mut got = [0u8; 6];
        std::io::Read::read_exact(&mut client, &mut got).expect("test socket");
        assert_eq!(&got, b"answer");

        // Nothing to read now: the read registers the socket and waits. Polled once by hand
        // (pending: nothing was sent), then the bytes are sent and the same read finishes.
        let mut read = Box::pin(s.read(&mut buf));
        let first = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "a read with nothing sent finished: {first:?}");
        client.write_all(b"more").expect("test socket");
        let n = read.await.expect("test socket");
        assert_eq!(&buf[..n], b"more");
        assert!(matches!(s, Stream::Tcp(_)), "a blocked read registers the socket");
        assert!(s.tcp().is_some());
        drop(client);
        // End of stream reads as 0 bytes.
        assert_eq!(s.read(&mut buf).await.expect("test socket"), 0);
    }

    /// An exchange that never blocks leaves the socket unregistered; `halves(false)` hands
    /// out the whole stream for writing and a read half that refuses to read.
    #[tokio::test]
    async fn fresh_stream_answers_without_registering() {
        let (mut s, mut client) = fresh_pair();
        {
            let (mut r, mut w) = s.halves(false);
            w.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.expect("test socket");
            w.flush().await.expect("test socket");
            let mut b = [0u8; 1];
            assert!(r.read(&mut b).await.is_err());
        }
        assert!(matches!(s, Stream::Fresh(Some(_))), "nothing blocked: still unregistered");
        assert!(s.local_addr().is_ok());
        s.shutdown().await.expect("test socket");
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut client, &mut got).expect("test socket");
        assert_eq!(got, b"HTTP/1.1 200 OK\r\n\r\n");
        // Splitting for a body registers it (both halves wait at once).
        let _ = s.split();
        assert!(matches!(s, Stream::Tcp(_)));
    }
}
