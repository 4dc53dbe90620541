//! `UdpEcho`: sends every datagram back to its sender.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::UdpSocket;

use crate::fixture::{self, log, Fixture};

#[derive(Default)]
struct Stats {
    datagrams: AtomicU64,
    bytes: AtomicU64,
}

/// UDP echo server on its own thread; stops when dropped.
pub struct UdpEcho {
    addr: SocketAddr,
    stats: Arc<Stats>,
    _fixture: Fixture,
}

impl UdpEcho {
    /// Starts on 127.0.0.1 with an ephemeral port.
    pub fn start() -> io::Result<UdpEcho> {
        UdpEcho::start_on(fixture::LOCALHOST_V4)
    }

    /// Starts on `addr`.
    pub fn start_on(addr: SocketAddr) -> io::Result<UdpEcho> {
        let stats = Arc::new(Stats::default());
        let served = Arc::clone(&stats);
        let (fixture, addr) = Fixture::spawn("rustle-udp-echo", move || {
            let std_sock = std::net::UdpSocket::bind(addr)?;
            std_sock.set_nonblocking(true)?;
            let sock = UdpSocket::from_std(std_sock)?;
            let addr = sock.local_addr()?;
            Ok((addr, echo_loop(sock, served)))
        })?;
        Ok(UdpEcho { addr, stats, _fixture: fixture })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Datagrams received (each is echoed once).
    pub fn datagrams(&self) -> u64 {
        self.stats.datagrams.load(Ordering::Relaxed)
    }

    /// Payload bytes received.
    pub fn bytes(&self) -> u64 {
        self.stats.bytes.load(Ordering::Relaxed)
    }
}

async fn echo_loop(sock: UdpSocket, stats: Arc<Stats>) {
    // Max UDP payload, so no datagram is ever truncated.
    let mut buf = vec![0u8; 65536];
    loop {
        match sock.recv_from(&mut buf).await {
            Ok((n, from)) => {
                stats.datagrams.fetch_add(1, Ordering::Relaxed);
                stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
                if let Err(e) = sock.send_to(&buf[..n], from).await {
                    log!("udp echo send to {from} failed: {e}");
                }
            }
            // ICMP port-unreachable from an earlier send surfaces here on
            // some platforms; it must not stop the echo.
            Err(e) => log!("udp echo recv failed: {e}"),
        }
    }
}
