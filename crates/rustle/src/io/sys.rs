//! The only unsafe code in rustle: splice(2) through pipes, which no safe crate offers for
//! tokio's sockets, in-kernel forwarding's BPF maps and program (`bpf`), the probe for kernel TLS (setsockopt TCP_ULP), handing the C
//! allocator's free pages back to the kernel (malloc_trim), TCP_DEFER_ACCEPT on listeners
//! and SO_RCVLOWAT on spliced sockets, and registering with tokio's event loop a listening
//! socket (without tokio's accept, which registers every connection) and a worker's park
//! of idle tunnels, reading CLOCK_MONOTONIC for systemd, and taking ownership of
//! listening sockets another process passed (systemd's socket activation, or a rustle
//! handing its sockets over with SCM_RIGHTS), and a non-blocking peek (MSG_PEEK) for a
//! caller that must tell its event loop when a peek found too little. Everything here is a thin, checked wrapper;
//! the rest of the proxy sees a safe `Pipe`, a yes/no, a hint and owned descriptors.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Returns the C allocator's free memory to the kernel. glibc keeps what is freed for
/// reuse, so after a burst (thousands of connections set up at once, each with a request
/// buffer) a worker's RSS would stay at its peak although the memory is free. Called when
/// a worker's buffer pool shrank; a no-op where the C library is not glibc.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it walks glibc's own heap bookkeeping under
    // glibc's locks and only releases pages no allocation uses.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd's `MONOTONIC_USEC=` is read on
/// (`std::time::Instant` does not say its value).
pub(crate) fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration; CLOCK_MONOTONIC
    // is always available on Linux, and on failure `ts` stays zero.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let micros = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000;
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// A listening socket whose readiness tokio watches, so that connections can be taken
/// with accept4 and registered only when needed (tokio's own listener registers each one
/// as it accepts it).
pub(crate) fn watch_listener(
    listener: std::net::TcpListener,
) -> io::Result<tokio::io::unix::AsyncFd<std::net::TcpListener>> {
    listener.set_nonblocking(true)?;
    // SAFETY: the AsyncFd takes the listener by value and owns it until it is dropped: the
    // descriptor stays open, refers to the same socket, and `as_raw_fd` keeps returning
    // it for as long as it is registered (std's listener never changes its fd).
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(listener, tokio::io::Interest::READABLE)
    }
    .map_err(|e| e.into_parts().1)
}

/// A worker's park (an epoll set of parked sockets, see `park`) watched by tokio's event
/// loop: readable when a parked socket has something to say.
pub(crate) fn watch_poll(poll: mio::Poll) -> io::Result<tokio::io::unix::AsyncFd<mio::Poll>> {
    // SAFETY: the AsyncFd takes the poll by value and owns it until it is dropped: its
    // epoll descriptor stays open and `as_raw_fd` returns that same descriptor for as long
    // as it is registered (mio's Poll never changes it).
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(poll, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Asks the kernel to hand over connections on this listener only once their first bytes
/// have arrived (TCP_DEFER_ACCEPT, for protocols whose client speaks first): the
/// proxy's first read then finds the request, and a client that never sends costs no
/// accept. A connection still silent after about `secs` seconds is handed over anyway.
pub(crate) fn defer_accept(listener: &impl AsRawFd, secs: u32) -> io::Result<()> {
    let secs = libc::c_int::try_from(secs).unwrap_or(libc::c_int::MAX);
    set_int(listener, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, secs)
}

/// Shuts a connected socket down both ways (shutdown(2), SHUT_RDWR) by its descriptor
/// number: every read of it then ends and every write fails, so whatever task or parked
/// tunnel holds it ends its exchange at its next wake-up, without being found. The caller
/// holds the number only while the socket is open (a connection's guard, released when
/// the connection ends). Errors are ignored: a socket already shut down or reset is
/// closing anyway.
pub(crate) fn shutdown_both(fd: std::os::fd::RawFd) {
    // SAFETY: shutdown takes no pointers and does not close or free the descriptor; on a
    // number that is not a socket it fails with ENOTSOCK.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Sets a socket's receive low-water mark (SO_RCVLOWAT): epoll then reports the socket
/// readable only once this many bytes are queued, or the stream ended or failed, or the
/// receive window is nearly closed. A non-blocking read still returns whatever is there.
/// 1 is the default (any byte wakes the reader).
pub(crate) fn set_rcvlowat(socket: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_int(socket, libc::SOL_SOCKET, libc::SO_RCVLOWAT, bytes)
}

/// Copies the bytes queued on `socket` into `buf` without taking them (recv with
/// MSG_PEEK | MSG_DONTWAIT): `WouldBlock` when none are, 0 at the end of the stream.
/// tokio's own `peek` cannot be run inside `try_io`/`async_io`, which a caller waiting for
/// *more* bytes than are queued needs (a peek leaves the socket readable).
pub(crate) fn peek(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv on a descriptor kept open by the borrow, writing at most `buf.len()`
    // bytes into `buf`, which is valid and exclusively borrowed for that length.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

fn set_int(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt on a descriptor the caller keeps open (it is borrowed), with a
    // pointer to `value` and its exact size; the kernel only reads those bytes.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the kernel can take over TLS records: attaches the `tls` upper-layer protocol
/// to a connected loopback socket (the only way to ask; ENOENT means the module is not
/// there). The sockets are closed before this returns.
#[cfg(feature = "ktls")]
pub(crate) fn ktls_probe() -> io::Result<()> {
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    let client = std::net::TcpStream::connect(listener.local_addr()?)?;
    let _server = listener.accept()?;
    let ulp = b"tls";
    // SAFETY: setsockopt on a socket we own, with a pointer to `ulp` and its exact length;
    // the kernel only reads those bytes.
    let rc = unsafe {
        libc::setsockopt(
            client.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_ULP,
            ulp.as_ptr().cast(),
            ulp.len() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Descriptors at most in one message of `send_fds` (the kernel's SCM_MAX_FD is 253).
pub(crate) const MAX_FDS_PER_MESSAGE: usize = 250;

/// Sends `bytes` on a Unix stream socket with `fds` attached (SCM_RIGHTS): the receiver
/// gets descriptors of the same open sockets. At most `MAX_FDS_PER_MESSAGE` at once.
pub(crate) fn send_fds(
    socket: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let raw: Vec<libc::c_int> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsgs = match raw.is_empty() {
        true => Vec::new(),
        false => vec![ControlMessage::ScmRights(&raw)],
    };
    let iov = [io::IoSlice::new(bytes)];
    let sent = sendmsg::<()>(socket.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != bytes.len() {
        return Err(io::Error::other("short write of a message with descriptors"));
    }
    Ok(())
}

/// Receives bytes into `buf` from a Unix stream socket, with the descriptors that came
/// with them (SCM_RIGHTS), now owned here (close-on-exec). 0 bytes: the peer closed.
pub(crate) fn recv_fds(
    socket: &std::os::unix::net::UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut iov = [io::IoSliceMut::new(buf)];
    // Room for the most descriptors one message can carry, so that none is cut off.
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 253]);
    let msg =
        recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            for fd in received {
                // SAFETY: the kernel has just installed this descriptor in our table for
                // this message (SCM_RIGHTS); nothing else in the process knows its
                // number, so the OwnedFd is its only owner and closes it once.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok((msg.bytes, fds))
}

/// Listening sockets passed by the service manager (systemd's socket activation): when
/// `LISTEN_PID` is this process, the `LISTEN_FDS` descriptors from 3 on, with their
/// names from `LISTEN_FDNAMES` when given. The variables are removed, so that a second
/// call finds none (and no child inherits them); an empty list without them.
pub(crate) fn listen_fds() -> io::Result<Vec<(OwnedFd, Option<String>)>> {
    let (Some(pid), Some(count)) = (std::env::var_os("LISTEN_PID"), std::env::var_os("LISTEN_FDS"))
    else {
        return Ok(Vec::new());
    };
    let names = std::env::var("LISTEN_FDNAMES").ok();
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    if pid.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id()) {
        return Ok(Vec::new());
    }
    let bad = || io::Error::other(format!("LISTEN_FDS={count:?} is not a count of descriptors"));
    let count: libc::c_int = count.to_str().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    if !(0..=4096).contains(&count) {
        return Err(bad());
    }
    let mut names = names.as_deref().unwrap_or("").split(':').map(str::to_string);
    let mut fds = Vec::new();
    for fd in 3..3 + count {
        // SAFETY: fcntl(F_GETFD) on a descriptor number only reads its flags; -1 tells
        // that the service manager did not leave it open.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            return Err(io::Error::other(format!(
                "LISTEN_FDS says descriptor {fd} was passed, but it is not open"
            )));
        }
        // SAFETY: as above, and setting FD_CLOEXEC only changes this descriptor's flag.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        // SAFETY: the service manager passed descriptors 3..3+LISTEN_FDS to this process
        // (LISTEN_PID) for it to own; nothing else in rustle uses them, and the variables
        // are gone, so no other OwnedFd for them is ever made.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        fds.push((owned, names.next().filter(|n| !n.is_empty())));
    }
    Ok(fds)
}

/// A pipe used as the in-kernel buffer between two sockets, with the count of bytes in it.
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    len: usize,
    cap: usize,
}

impl Pipe {
    /// A non-blocking pipe, asked to hold `size` bytes (the kernel may round it, or refuse
    /// above /proc/sys/fs/pipe-max-size, in which case the default 64 KiB stays).
    pub(crate) fn new(size: usize) -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a writable array of two ints, which is what pipe2 fills.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else;
        // OwnedFd closes each exactly once.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        // SAFETY: fcntl(F_SETPIPE_SZ) on a descriptor we own, with an int argument; a
        // failure only leaves the default size.
        let mut got = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
        if got <= 0 {
            // Refused (a user past pipe-user-pages-soft gets small pipes): ask what it is.
            // SAFETY: fcntl(F_GETPIPE_SZ) on a descriptor we own; it only returns a number.
            got = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) };
        }
        let cap = usize::try_from(got).ok().filter(|&c| c > 0).unwrap_or(4096);
        Ok(Pipe { read, write, len: 0, cap })
    }

    /// Bytes in the pipe, not yet passed on.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room left in the pipe.
    pub(crate) fn room(&self) -> usize {
        self.cap - self.len
    }

    /// Moves up to `room()` bytes from a socket into the pipe; 0 means end of stream.
    #[cfg(test)]
    pub(crate) fn fill(&mut self, from: BorrowedFd<'_>) -> io::Result<usize> {
        self.fill_up_to(from, usize::MAX)
    }

    /// Like `fill`, moving at most `max` bytes (the rest of a body of known length).
    pub(crate) fn fill_up_to(&mut self, from: BorrowedFd<'_>, max: usize) -> io::Result<usize> {
        let n = splice(from, self.write.as_fd_ref(), self.room().min(max))?;
        self.len += n;
        Ok(n)
    }

    /// Moves bytes from the pipe to a socket, as many as it takes.
    pub(crate) fn drain(&mut self, to: BorrowedFd<'_>) -> io::Result<usize> {
        let n = splice(self.read.as_fd_ref(), to, self.len)?;
        self.len -= n;
        Ok(n)
    }
}

trait AsFdRef {
    fn as_fd_ref(&self) -> BorrowedFd<'_>;
}

impl AsFdRef for OwnedFd {
    fn as_fd_ref(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}

fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    // SAFETY: both descriptors are open for the duration of the call (they are borrowed),
    // null offsets are what splice expects for sockets and pipes, and no memory of ours is
    // read or written by the kernel here.
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            flags,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // n >= 0 was checked and is at most len, which is a usize.
    Ok(n as usize)
}

pub(crate) mod bpf;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    /// Waits (up to 5 s) until `s` has bytes or its end ready to read, with a blocking peek;
    /// leaves it non-blocking. Loopback delivers promptly, but not always before the
    /// sender's write returns.
    fn wait_readable(s: &std::net::TcpStream) {
        s.set_nonblocking(false).expect("blocking");
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
        s.peek(&mut [0u8; 1]).expect("bytes or their end within 5 s");
        s.set_nonblocking(true).expect("nonblocking");
    }

    #[test]
    fn splices_between_sockets() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut a = std::net::TcpStream::connect(addr).expect("connect");
        let (b, _) = listener.accept().expect("accept");
        let c = std::net::TcpStream::connect(addr).expect("connect");
        let (mut d, _) = listener.accept().expect("accept");
        b.set_nonblocking(true).expect("nonblocking");
        let mut pipe = Pipe::new(1 << 20).expect("pipe");
        assert!(pipe.room() >= 64 * 1024);
        // Nothing to read yet: EAGAIN, not a hang.
        let e = pipe.fill(b.as_fd()).expect_err("nothing yet");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        a.write_all(b"hello through the kernel").expect("write");
        wait_readable(&b);
        let n = pipe.fill(b.as_fd()).expect("fill");
        assert_eq!(n, 24);
        assert_eq!(pipe.len(), 24);
        assert_eq!(pipe.drain(c.as_fd()).expect("drain"), 24);
        assert!(pipe.is_empty());
        let mut got = [0u8; 24];
        d.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"hello through the kernel");
        drop(a);
        wait_readable(&b);
        assert_eq!(pipe.fill(b.as_fd()).expect("eof"), 0, "end of stream reads as 0");
    }
}
