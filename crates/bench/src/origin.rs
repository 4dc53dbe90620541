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
                // Small responses must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                tokio::spawn(http::serve(stream, Arc::clone(&stats)));
            }
            Err(e) => fixture::accept_backoff(e).await,
        }
    }
}
