//! Raw TCP fixtures: `TcpEcho` (echo with half-close propagation) and
//! `TcpServe` (answer only after the client half-closes).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::fixture::{self, log, Fixture};

#[derive(Default)]
struct Stats {
    connections: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// Counters and lifetime shared by both TCP fixtures.
struct Server {
    addr: SocketAddr,
    stats: Arc<Stats>,
    _fixture: Fixture,
}

impl Server {
    fn start(name: &str, addr: SocketAddr, payload: Option<Arc<Vec<u8>>>) -> io::Result<Server> {
        let stats = Arc::new(Stats::default());
        let served = Arc::clone(&stats);
        let (fixture, addr) = Fixture::spawn(name, move || {
            let listener = fixture::tcp_listener(addr)?;
            let addr = listener.local_addr()?;
            Ok((addr, accept_loop(listener, served, payload)))
        })?;
        Ok(Server { addr, stats, _fixture: fixture })
    }
}

async fn accept_loop(listener: TcpListener, stats: Arc<Stats>, payload: Option<Arc<Vec<u8>>>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                stats.connections.fetch_add(1, Ordering::Relaxed);
                let _ = stream.set_nodelay(true);
                let stats = Arc::clone(&stats);
                let payload = payload.clone();
                tokio::spawn(async move {
                    let res = match payload {
                        None => echo(stream, &stats).await,
                        Some(p) => serve_after_eof(stream, &stats, &p).await,
                    };
                    if let Err(e) = res {
                        log!("tcp fixture connection error: {e}");
                    }
                });
            }
            Err(e) => fixture::accept_backoff(e).await,
        }
    }
}

/// Echoes until the client half-closes, then finishes writing and shuts
/// down our write side too, so the client sees EOF after the last byte.
async fn echo(mut stream: TcpStream, stats: &Stats) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        stats.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
        stream.write_all(&buf[..n]).await?;
        stats.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }
    stream.shutdown().await
}

/// Reads (and discards) until the client half-closes, then writes the whole
/// payload and closes: the client must still be able to receive after
/// shutting down its write side.
async fn serve_after_eof(mut stream: TcpStream, stats: &Stats, payload: &[u8]) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        stats.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }
    stream.write_all(payload).await?;
    stats.bytes_out.fetch_add(payload.len() as u64, Ordering::Relaxed);
    stream.shutdown().await
}

macro_rules! tcp_fixture_api {
    ($ty:ident) => {
        impl $ty {
            /// The bound address.
            pub fn addr(&self) -> SocketAddr {
                self.0.addr
            }

            /// Connections accepted.
            pub fn connections(&self) -> u64 {
                self.0.stats.connections.load(Ordering::Relaxed)
            }

            /// Bytes received from clients.
            pub fn bytes_in(&self) -> u64 {
                self.0.stats.bytes_in.load(Ordering::Relaxed)
            }

            /// Bytes written to clients.
            pub fn bytes_out(&self) -> u64 {
                self.0.stats.bytes_out.load(Ordering::Relaxed)
            }
        }
    };
}

/// TCP echo server; propagates the client's half-close back as our own FIN.
pub struct TcpEcho(Server);

impl TcpEcho {
    /// Starts on 127.0.0.1 with an ephemeral port.
    pub fn start() -> io::Result<TcpEcho> {
        TcpEcho::start_on(fixture::LOCALHOST_V4)
    }

    /// Starts on `addr`.
    pub fn start_on(addr: SocketAddr) -> io::Result<TcpEcho> {
        Server::start("rustle-tcp-echo", addr, None).map(TcpEcho)
    }
}
tcp_fixture_api!(TcpEcho);

/// Per connection: read to EOF, then write `payload` and close.
pub struct TcpServe(Server);

impl TcpServe {
    /// Starts on 127.0.0.1 with an ephemeral port.
    pub fn start_with(payload: Vec<u8>) -> io::Result<TcpServe> {
        TcpServe::start_on(fixture::LOCALHOST_V4, payload)
    }

    /// Starts on `addr`.
    pub fn start_on(addr: SocketAddr, payload: Vec<u8>) -> io::Result<TcpServe> {
        Server::start("rustle-tcp-serve", addr, Some(Arc::new(payload))).map(TcpServe)
    }
}
tcp_fixture_api!(TcpServe);
