//! The two ends of a relay as the engine sees them: read, write, flush, shut down, and the
//! capabilities only some ends have. A bare socket (`TcpStream`, owned or borrowed) is
//! readable before it is read, splices, takes a low-water mark and needs no flush; a
//! stream with TLS on it (`conn::Stream`) is read and written through its own
//! `AsyncRead`/`AsyncWrite` and flushed. The engine is generic over `End`, so each pair
//! of ends gets its own compiled relay and a socket relay carries no flushing and a TLS
//! relay no splicing.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::io::conn::Stream;

/// One end of a relay.
pub(crate) trait End {
    /// The bytes on the socket are the payload: the relay may splice, set a low-water
    /// mark and apply the grace delay, and writes need no flush.
    const SOCKET: bool;

    /// The socket, for an end whose bytes on it are the payload (`SOCKET`).
    fn socket(&self) -> Option<&TcpStream>;

    /// Ready once a read would not block; a stream without readiness of its own is
    /// always ready (its read then waits).
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Reads into `buf`; 0 is end of stream.
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>>;

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>>;

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Passes end of stream on (a TLS close_notify, then FIN).
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// The relay gives up on this end (idle timeout): tells the peer so, as far as that
    /// goes without waiting. A socket is simply closed by its owner.
    fn abandon(&mut self) {}

    /// How much of `want` this end takes as a destination now: an HTTP/2 stream's
    /// window, asked before the source is read so that nothing is read that could not be
    /// sent. Sockets and TLS streams take all of it.
    #[inline]
    fn poll_room(&mut self, _: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(want))
    }

    /// The room asked for is not used now (the read would block, or a limit pauses):
    /// give it back, so that a quiet tunnel holds no window.
    #[inline]
    fn release_room(&mut self) {}

    /// Ready with the error once the peer gave up on this end while the relay waits
    /// elsewhere (an HTTP/2 stream's reset); sockets and streams show it on I/O.
    #[inline]
    fn poll_gone(&mut self, _: &mut Context<'_>) -> Poll<io::Error> {
        Poll::Pending
    }
}

/// A socket read or write, tried at once: the engine waited for readiness before it
/// reads, and a write usually goes through, so readiness is asked (and the task's budget
/// spent) only when the try would block.
fn read_socket(s: &TcpStream, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
    loop {
        match s.try_read(buf) {
            Ok(n) => {
                if n > 0 && n < buf.len() {
                    drained(s);
                }
                return Poll::Ready(Ok(n));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(s.poll_read_ready(cx))?,
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

fn write_socket(s: &TcpStream, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    loop {
        match s.try_write(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(s.poll_write_ready(cx))?,
            r => return Poll::Ready(r),
        }
    }
}

/// A read that returned less than asked for emptied the socket: clear tokio's cached
/// readiness without a syscall, so the next wait goes to epoll instead of trying a read
/// that would only say EAGAIN (tokio's own poll_read does the same).
pub(crate) fn drained(s: &TcpStream) {
    let _ = s.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
}

macro_rules! socket_end {
    ($t:ty) => {
        impl End for $t {
            const SOCKET: bool = true;

            #[inline]
            fn socket(&self) -> Option<&TcpStream> {
                Some(self)
            }

            #[inline]
            fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                TcpStream::poll_read_ready(self, cx)
            }

            #[inline]
            fn poll_read(
                &mut self,
                cx: &mut Context<'_>,
                buf: &mut [u8],
            ) -> Poll<io::Result<usize>> {
                read_socket(self, cx, buf)
            }

            #[inline]
            fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                write_socket(self, cx, buf)
            }

            #[inline]
            fn poll_flush(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }

            fn poll_shutdown(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                let s: &TcpStream = self;
                Poll::Ready(socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write))
            }
        }
    };
}

socket_end!(TcpStream);
socket_end!(&TcpStream);

impl End for Stream {
    const SOCKET: bool = false;

    #[inline]
    fn socket(&self) -> Option<&TcpStream> {
        None
    }

    #[inline]
    fn poll_read_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut rb = ReadBuf::new(buf);
        ready!(AsyncRead::poll_read(Pin::new(self), cx, &mut rb))?;
        Poll::Ready(Ok(rb.filled().len()))
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        AsyncWrite::poll_write(Pin::new(self), cx, buf)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_flush(Pin::new(self), cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_shutdown(Pin::new(self), cx)
    }

    fn abandon(&mut self) {
        crate::io::conn::shutdown_now(self);
    }
}
