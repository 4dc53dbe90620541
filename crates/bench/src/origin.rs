//! `Origin`: the plain-TCP HTTP/1.1 origin fixture.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::fixture::{self, Fixture};
use crate::http::{self, HttpStats};

pub use crate::pattern::{pattern, pattern_byte, pattern_sha256_hex};
pub use crate::routes::malformed_response;

/// An in-process HTTP/1.1 origin on its own thread; stops when dropped.
pub struct Origin {
    addr: SocketAddr,
    stats: Arc<HttpStats>,
    _fixture: Fixture,
}

impl Origin {
    /// Starts on 127.0.0.1 with an ephemeral port.
    pub fn start() -> io::Result<Origin> {
        Origin::start_on(fixture::LOCALHOST_V4)
    }

    /// Starts on `addr` (e.g. `[::1]:0`).
    pub fn start_on(addr: SocketAddr) -> io::Result<Origin> {
        let stats = Arc::new(HttpStats::default());
        let served = Arc::clone(&stats);
        let (fixture, addr) = Fixture::spawn("rustle-origin", move || {
            let listener = fixture::tcp_listener(addr)?;
            let addr = listener.local_addr()?;
            Ok((addr, accept_loop(listener, served)))
        })?;
        Ok(Origin { addr, stats, _fixture: fixture })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR{path}`; `path` should start with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Requests answered (counted when the head is parsed, before the
    /// response is written, so a client that has its response sees it).
    pub fn requests(&self) -> u64 {
        self.stats.requests.load(Ordering::Relaxed)
    }

    /// TCP connections accepted.
    pub fn connections(&self) -> u64 {
        self.stats.connections.load(Ordering::Relaxed)
    }

    /// TCP connections open now: counted from accept until the connection's
    /// serve task ends (the peer closed it, the origin closed it, or it failed).
    pub fn open_connections(&self) -> u64 {
        self.stats.open.load(Ordering::Relaxed)
    }

    /// Complete WebSocket data messages echoed on `/ws`.
    pub fn ws_messages(&self) -> u64 {
        self.stats.ws_messages.load(Ordering::Relaxed)
    }

    /// Raw bytes of the most recent request head, CRLFCRLF included.
    pub fn last_request_head(&self) -> Vec<u8> {
        self.stats.last_head()
    }
}

async fn accept_loop(listener: TcpListener, stats: Arc<HttpStats>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                stats.connections.fetch_add(1, Ordering::Relaxed);
                let open = stats.open();
                // Small responses must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                let stats = Arc::clone(&stats);
                tokio::spawn(async move {
                    let _open = open;
                    http::serve(stream, stats).await;
                });
            }
            Err(e) => fixture::accept_backoff(e).await,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits (up to 5 s) for the open count to be `want`; panics with the last value.
    fn settles_at(o: &Origin, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while o.open_connections() != want {
            assert!(
                Instant::now() < deadline,
                "open connections stayed at {}, expected {want}",
                o.open_connections()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `req` and reads until `done` says the bytes are a whole answer.
    fn ask(s: &mut TcpStream, req: &[u8], done: &[u8]) {
        s.write_all(req).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(done.len()).any(|w| w == done) {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "EOF before {done:?}: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    }

    fn open(o: &Origin) -> TcpStream {
        let s = TcpStream::connect(o.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    #[test]
    fn open_connections_go_down_on_every_way_a_connection_ends() {
        let o = Origin::start().unwrap();
        assert_eq!(o.open_connections(), 0);
        let get = b"GET /bytes/3 HTTP/1.1\r\nHost: x\r\n\r\n";
        // Kept alive, then closed by the client (EOF between requests).
        let mut idle = open(&o);
        ask(&mut idle, get, b"\r\n\r\n");
        // Closed by the origin: `Connection: close`.
        let closing = open(&o);
        // Rejected: a malformed head.
        let rejected = open(&o);
        // Failed: the client resets the connection in the middle of a head.
        let mut reset = socket2::Socket::from(open(&o));
        reset.write_all(b"GET /bytes/3 HTTP/1.1\r\nHo").unwrap();
        settles_at(&o, 4);

        // The origin half-closes after these two, then waits (up to 2 s) for the
        // client's EOF: read theirs, then close.
        for (mut s, req, done) in [
            (
                closing,
                &b"GET /bytes/3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..],
                &b"\r\n\r\n"[..],
            ),
            (rejected, b"NOT HTTP\r\n\r\n", b"400"),
        ] {
            let before = o.open_connections();
            ask(&mut s, req, done);
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            drop(s);
            settles_at(&o, before - 1);
        }
        reset.set_linger(Some(Duration::ZERO)).unwrap();
        drop(reset);
        settles_at(&o, 1);
        drop(idle);
        settles_at(&o, 0);
        assert_eq!(o.connections(), 4);
    }
}
