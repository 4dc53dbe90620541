//! Peers that misbehave on purpose, for fault-injection tests: `FaultyOrigin`, an origin
//! that fails in one chosen way on every connection (speaking HTTP/1.1, or raw bytes for
//! tunnels and relays), and `FaultyClient`, the same set of faults from the client's side
//! (a blocking socket driven step by step), with `Trickle`, an async stream adapter that
//! writes one byte at a time (a head split byte by byte under any protocol, HTTP/2 too).
//!
//! What each fault sends is fixed here (`ANNOUNCED`, `RESET_AFTER`, `OVERRUN_EXTRA`...),
//! so a test checks exactly which bytes reached the other side.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

use crate::fixture::{self, log, Fixture};
use crate::pattern::pattern;

/// The body length a `ResetMidBody` origin announces (Content-Length).
pub const ANNOUNCED: usize = 100_000;
/// How many body bytes (raw: bytes) a `ResetMidBody` origin sends before its reset.
pub const RESET_AFTER: usize = 1_000;
/// The body length an `Overrun` origin announces.
pub const OVERRUN_ANNOUNCED: usize = 10;
/// What an `Overrun` origin sends after the announced body: bytes that must reach no
/// client (10 more, 20 in all). A request line no parser takes, should they be read as
/// the next message.
pub const OVERRUN_EXTRA: &[u8; 10] = b"NOT HTTP\r\n";
/// The body of a `SplitHead` answer (its whole answer under `Speak::Raw`).
pub const SPLIT_BODY_LEN: usize = 16;
/// How long a `ResetMidBody` origin waits between its last byte and the reset, so that
/// the reset finds the bytes already taken and forwarded (the state the fault is about:
/// in the middle of a body, not at its start).
pub const RESET_PAUSE: Duration = Duration::from_millis(50);

/// One way of failing; a `FaultyOrigin` fails this way on every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// HTTP: `200` announcing `ANNOUNCED` bytes, `RESET_AFTER` of them, then a reset
    /// (SO_LINGER 0). Raw: `RESET_AFTER` pattern bytes, then the reset.
    ResetMidBody,
    /// HTTP: `200` with a close-delimited body (no length: it ends when the connection
    /// does), `RESET_AFTER` bytes of it, then a reset; only the reset tells a client that
    /// the body was cut. Raw: as `ResetMidBody`.
    ResetUnframed,
    /// HTTP: the request read whole, then the connection closed without a byte. Raw:
    /// closed at once.
    CloseBeforeAnswer,
    /// HTTP: a `200` head written one byte at a time, `pause` between bytes, then a
    /// `SPLIT_BODY_LEN` body at once. Raw: the same `SPLIT_BODY_LEN` bytes, one by one.
    SplitHead { pause: Duration },
    /// HTTP: a `200` head announcing `len` bytes at once, then the body one byte every
    /// `every`. Raw: `len` bytes the same way, then end of stream.
    Drip { every: Duration, len: usize },
    /// Accepts and never reads nor writes: a peer's writes fill the socket buffers and
    /// stay there until it gives up. The connection is held until the fixture stops.
    NeverRead,
    /// HTTP: `200` with `Content-Length: OVERRUN_ANNOUNCED`, the announced body, then
    /// `OVERRUN_EXTRA` (more than announced). Under `Speak::Raw` there is no framing to
    /// break, and it behaves as `Drip` with no pause.
    Overrun,
}

impl Fault {
    /// A short name for test output.
    pub fn name(self) -> &'static str {
        match self {
            Fault::ResetMidBody => "reset mid-body",
            Fault::ResetUnframed => "reset mid close-delimited body",
            Fault::CloseBeforeAnswer => "close before answering",
            Fault::SplitHead { .. } => "head split byte by byte",
            Fault::Drip { .. } => "drip",
            Fault::NeverRead => "never read",
            Fault::Overrun => "more than announced",
        }
    }

    /// The body a client should receive whole, byte for byte, when the proxy carries the
    /// answer intact: `Some` for the faults that are only slow (and for `Overrun`: the
    /// announced part), `None` for those that break the answer.
    pub fn intact_body(self) -> Option<Vec<u8>> {
        match self {
            Fault::SplitHead { .. } => Some(pattern(SPLIT_BODY_LEN)),
            Fault::Drip { len, .. } => Some(pattern(len)),
            Fault::Overrun => Some(pattern(OVERRUN_ANNOUNCED)),
            Fault::ResetMidBody
            | Fault::ResetUnframed
            | Fault::CloseBeforeAnswer
            | Fault::NeverRead => None,
        }
    }
}

/// The protocol a `FaultyOrigin` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speak {
    /// Reads one HTTP/1.1 request (head and Content-Length body), then fails.
    Http,
    /// Fails at once on accepting, as the far end of a tunnel or a port relay.
    Raw,
}

#[derive(Default)]
struct Stats {
    connections: AtomicU64,
    requests: AtomicU64,
    open: AtomicU64,
}

/// An origin that fails in one way on every connection; stops when dropped.
pub struct FaultyOrigin {
    addr: SocketAddr,
    stats: Arc<Stats>,
    _fixture: Fixture,
}

impl FaultyOrigin {
    /// Starts on 127.0.0.1 with an ephemeral port.
    pub fn start(fault: Fault, speak: Speak) -> io::Result<FaultyOrigin> {
        let stats = Arc::new(Stats::default());
        let served = Arc::clone(&stats);
        let (fixture, addr) = Fixture::spawn("rustle-faulty-origin", move || {
            let listener = fixture::tcp_listener(fixture::LOCALHOST_V4)?;
            let addr = listener.local_addr()?;
            Ok((addr, accept_loop(listener, served, fault, speak)))
        })?;
        Ok(FaultyOrigin { addr, stats, _fixture: fixture })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.stats.connections.load(Ordering::Relaxed)
    }

    /// HTTP requests read whole (head and body) before failing.
    pub fn requests(&self) -> u64 {
        self.stats.requests.load(Ordering::Relaxed)
    }

    /// Connections whose task still runs: from accept until the fault has played out and
    /// the peer closed (a `NeverRead` connection stays open).
    pub fn open_connections(&self) -> u64 {
        self.stats.open.load(Ordering::Relaxed)
    }
}

/// One open connection in `Stats::open`, however its task ends.
struct Open(Arc<Stats>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn accept_loop(listener: TcpListener, stats: Arc<Stats>, fault: Fault, speak: Speak) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                stats.connections.fetch_add(1, Ordering::Relaxed);
                stats.open.fetch_add(1, Ordering::Relaxed);
                let open = Open(Arc::clone(&stats));
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &open.0, fault, speak).await {
                        log!("faulty origin ({}): {e}", fault.name());
                    }
                    drop(open);
                });
            }
            Err(e) => fixture::accept_backoff(e).await,
        }
    }
}

async fn serve(mut s: TcpStream, stats: &Stats, fault: Fault, speak: Speak) -> io::Result<()> {
    if fault == Fault::NeverRead {
        // Held, never polled: whatever comes stays in the socket buffers.
        std::future::pending::<()>().await;
    }
    if speak == Speak::Http {
        read_request(&mut s).await?;
        stats.requests.fetch_add(1, Ordering::Relaxed);
    }
    let http = speak == Speak::Http;
    match fault {
        Fault::NeverRead => {}
        Fault::CloseBeforeAnswer => return Ok(()),
        Fault::ResetMidBody | Fault::ResetUnframed => {
            if http && fault == Fault::ResetMidBody {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {ANNOUNCED}\r\n\r\n");
                s.write_all(head.as_bytes()).await?;
            } else if http {
                s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n").await?;
            }
            s.write_all(&pattern(RESET_AFTER)).await?;
            tokio::time::sleep(RESET_PAUSE).await;
            socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
            return Ok(());
        }
        Fault::SplitHead { pause } => {
            if http {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {SPLIT_BODY_LEN}\r\n\r\n");
                for b in head.as_bytes() {
                    s.write_all(&[*b]).await?;
                    tokio::time::sleep(pause).await;
                }
                s.write_all(&pattern(SPLIT_BODY_LEN)).await?;
            } else {
                for b in pattern(SPLIT_BODY_LEN) {
                    s.write_all(&[b]).await?;
                    tokio::time::sleep(pause).await;
                }
            }
        }
        Fault::Drip { every, len } => {
            if http {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
                s.write_all(head.as_bytes()).await?;
            }
            for b in pattern(len) {
                tokio::time::sleep(every).await;
                s.write_all(&[b]).await?;
            }
        }
        Fault::Overrun => {
            if http {
                let head =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {OVERRUN_ANNOUNCED}\r\n\r\n");
                let mut all = head.into_bytes();
                all.extend_from_slice(&pattern(OVERRUN_ANNOUNCED));
                all.extend_from_slice(OVERRUN_EXTRA);
                s.write_all(&all).await?;
            } else {
                s.write_all(&pattern(OVERRUN_ANNOUNCED)).await?;
            }
        }
    }
    // The answer is out: end our side, and take whatever comes until the peer closes,
    // so that closing sends no reset that could cut the answer short.
    if !http {
        s.shutdown().await?;
    }
    let mut sink = [0u8; 4096];
    while s.read(&mut sink).await? > 0 {}
    Ok(())
}

/// Reads one request head and its Content-Length body (a chunked body up to its last
/// chunk, roughly: tests send small ones); an error when the peer closes before.
async fn read_request(s: &mut TcpStream) -> io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = head.lines().any(|l| l.starts_with("transfer-encoding:"));
    let mut body = buf.split_off(head_end);
    loop {
        let done = match length {
            Some(n) => body.len() >= n,
            None => !chunked || body.windows(5).any(|w| w == b"0\r\n\r\n"),
        };
        if done {
            return Ok(());
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        body.extend_from_slice(&chunk[..n]);
    }
}

/// A client that misbehaves towards a proxy: a blocking socket with the steps faults are
/// made of. Reads time out after `FaultyClient::READ_TIMEOUT`.
pub struct FaultyClient {
    stream: std::net::TcpStream,
}

impl FaultyClient {
    /// How long a read waits before failing with `WouldBlock`/`TimedOut`.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

    /// Connects (TCP_NODELAY: every byte written goes out as its own segment).
    pub fn connect(addr: SocketAddr) -> io::Result<FaultyClient> {
        let stream = std::net::TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(FaultyClient::READ_TIMEOUT))?;
        Ok(FaultyClient { stream })
    }

    /// A client on a connection already set up (a tunnel after its handshake).
    pub fn from_stream(stream: std::net::TcpStream) -> FaultyClient {
        FaultyClient { stream }
    }

    /// The socket, for ordinary reads and writes between faults.
    pub fn stream(&mut self) -> &mut std::net::TcpStream {
        &mut self.stream
    }

    /// Writes `bytes` at once.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Writes `bytes` one at a time with `pause` after each: a head split byte by byte,
    /// or a body dripped.
    pub fn trickle(&mut self, bytes: &[u8], pause: Duration) -> io::Result<()> {
        for b in bytes {
            self.stream.write_all(&[*b])?;
            std::thread::sleep(pause);
        }
        Ok(())
    }

    /// Writes pattern bytes without blocking until the socket takes no more, even after
    /// a pause (a peer that never reads has then filled every buffer on the way); returns
    /// how many went.
    pub fn fill(&mut self) -> io::Result<usize> {
        self.stream.set_nonblocking(true)?;
        let block = pattern(64 * 1024);
        let mut sent = 0;
        let mut stuck = false;
        let res = loop {
            match self.stream.write(&block) {
                Ok(n) => {
                    sent += n;
                    stuck = false;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && stuck => break Ok(sent),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Room may come as the next hop drains; none after a pause means full.
                    std::thread::sleep(Duration::from_millis(50));
                    stuck = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.stream.set_nonblocking(false)?;
        res
    }

    /// Reads exactly `n` bytes.
    pub fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        self.stream.read_exact(&mut out)?;
        Ok(out)
    }

    /// Closes with a reset (SO_LINGER 0): whatever the proxy had not taken is dropped.
    pub fn reset(self) -> io::Result<()> {
        socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO))
    }

    /// Closes normally (FIN), whatever was left unsaid.
    pub fn close(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// An async stream whose writes go out one byte at a time, `pause` before each; reads
/// pass through. Wrapped around an HTTP/2 client's socket, it splits every frame of the
/// client (the preface and request heads included) byte by byte.
pub struct Trickle<S> {
    inner: S,
    pause: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S> Trickle<S> {
    pub fn new(inner: S, pause: Duration) -> Trickle<S> {
        Trickle { inner, pause, sleep: None }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Trickle<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Trickle<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let pause = self.pause;
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
        ready!(sleep.as_mut().poll(cx));
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &buf[..1]))?;
        self.sleep = None;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn fetch(origin: &FaultyOrigin) -> (Vec<u8>, io::Result<()>) {
        let mut c = FaultyClient::connect(origin.addr()).unwrap();
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let end = c.stream().read_to_end(&mut got).map(|_| ());
        (got, end)
    }

    fn body(got: &[u8]) -> &[u8] {
        let i = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        &got[i + 4..]
    }

    #[test]
    fn each_http_fault_sends_what_it_says() {
        let o = FaultyOrigin::start(Fault::ResetMidBody, Speak::Http).unwrap();
        let (got, end) = fetch(&o);
        assert_eq!(body(&got), pattern(RESET_AFTER));
        assert_eq!(end.unwrap_err().kind(), io::ErrorKind::ConnectionReset);

        let o = FaultyOrigin::start(Fault::CloseBeforeAnswer, Speak::Http).unwrap();
        let (got, end) = fetch(&o);
        assert!(got.is_empty() && end.is_ok());
        assert_eq!(o.requests(), 1);

        let fault = Fault::SplitHead { pause: Duration::from_millis(1) };
        let o = FaultyOrigin::start(fault, Speak::Http).unwrap();
        let mut c = FaultyClient::connect(o.addr()).unwrap();
        c.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc").unwrap();
        // The head comes in pieces.
        let mut first = [0u8; 64];
        assert!(c.stream().read(&mut first).unwrap() < 20);
        c.stream().shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        c.stream().read_to_end(&mut rest).unwrap();
        assert_eq!(body(&rest), fault.intact_body().unwrap());

        let fault = Fault::Drip { every: Duration::from_millis(1), len: 5 };
        let o = FaultyOrigin::start(fault, Speak::Http).unwrap();
        let mut c = FaultyClient::connect(o.addr()).unwrap();
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let got = c.take(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".len() + 5).unwrap();
        assert_eq!(body(&got), pattern(5));

        let o = FaultyOrigin::start(Fault::Overrun, Speak::Http).unwrap();
        let mut c = FaultyClient::connect(o.addr()).unwrap();
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        c.stream().shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.stream().read_to_end(&mut got).unwrap();
        let mut want = pattern(OVERRUN_ANNOUNCED);
        want.extend_from_slice(OVERRUN_EXTRA);
        assert_eq!(body(&got), want);
    }

    #[test]
    fn raw_faults_and_a_peer_that_never_reads() {
        let o = FaultyOrigin::start(Fault::ResetMidBody, Speak::Raw).unwrap();
        let mut c = FaultyClient::connect(o.addr()).unwrap();
        let mut got = Vec::new();
        let end = c.stream().read_to_end(&mut got);
        assert_eq!(got, pattern(RESET_AFTER));
        assert_eq!(end.unwrap_err().kind(), io::ErrorKind::ConnectionReset);

        let o = FaultyOrigin::start(Fault::CloseBeforeAnswer, Speak::Raw).unwrap();
        let mut c = FaultyClient::connect(o.addr()).unwrap();
        assert_eq!(c.stream().read(&mut [0u8; 16]).unwrap(), 0);

        let fault = Fault::Drip { every: Duration::from_millis(1), len: 7 };
        let o = FaultyOrigin::start(fault, Speak::Raw).unwrap();
        let mut c = FaultyClient::connect(o.addr()).unwrap();
        let mut got = Vec::new();
        c.stream().read_to_end(&mut got).unwrap();
        assert_eq!(got, pattern(7));

        let o = FaultyOrigin::start(Fault::NeverRead, Speak::Raw).unwrap();
        let mut c = FaultyClient::connect(o.addr()).unwrap();
        let sent = c.fill().unwrap();
        assert!(sent > 0);
        // Still held: nothing comes, no end.
        c.stream().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let err = c.stream().read(&mut [0u8; 16]).unwrap_err();
        assert!(matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut));
        assert_eq!((o.connections(), o.open_connections()), (1, 1));
    }

    #[tokio::test]
    async fn trickle_writes_one_byte_at_a_time() {
        let o = FaultyOrigin::start(Fault::CloseBeforeAnswer, Speak::Http).unwrap();
        let s = TcpStream::connect(o.addr()).await.unwrap();
        let mut t = Trickle::new(s, Duration::from_millis(1));
        assert_eq!(t.write(b"GET / HTTP/1.1\r\n").await.unwrap(), 1);
        t.write_all(b"ET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut rest = Vec::new();
        t.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        assert_eq!(o.requests(), 1);
    }
}
