//! Moving bytes both ways between two connected sockets: CONNECT tunnels and upgraded
//! connections. Each direction runs until its reader sees end-of-stream, which is passed
//! on as a half-close (shutdown of the write side), so a client that has finished
//! sending still receives the whole answer. The relay ends when both directions have
//! ended, when either side fails, or when no byte has moved either way for the idle
//! timeout.

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Phase};

/// Bytes per read. 16 KiB matches what the kernel usually has ready on a busy socket and
/// keeps a pair of buffers small next to the socket buffers themselves.
const CHUNK: usize = 16 * 1024;

/// What a relay moved.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    /// From the client towards the upstream.
    pub up: u64,
    /// From the upstream towards the client.
    pub down: u64,
}

/// Relays until both directions end. `initial_up` and `initial_down` are bytes already
/// read from one side (beyond a parsed head) that belong to the other.
pub async fn run<C, U>(
    client: &mut C,
    upstream: &mut U,
    initial_up: &[u8],
    initial_down: &[u8],
    idle: Duration,
) -> (Totals, Result<(), Error>)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let last = Cell::new(Instant::now());
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let up = Cell::new(0u64);
    let down = Cell::new(0u64);
    let a = one_way(&mut cr, &mut uw, initial_up, &up, &last, idle);
    let b = one_way(&mut ur, &mut cw, initial_down, &down, &last, idle);
    let result = tokio::try_join!(a, b).map(|_| ());
    (Totals { up: up.get(), down: down.get() }, result)
}

async fn one_way<R, W>(
    r: &mut R,
    w: &mut W,
    initial: &[u8],
    count: &Cell<u64>,
    last: &Cell<Instant>,
    idle: Duration,
) -> Result<(), Error>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if !initial.is_empty() {
        w.write_all(initial).await.map_err(Error::Client)?;
        count.set(count.get() + initial.len() as u64);
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = loop {
            match tokio::time::timeout(idle, r.read(&mut buf)).await {
                Ok(res) => break res.map_err(side_error)?,
                // The other direction may be busy: only a tunnel silent both ways is idle.
                Err(_) if last.get().elapsed() < idle => continue,
                Err(_) => return Err(Error::Timeout(Phase::TunnelIdle)),
            }
        };
        if n == 0 {
            // Pass the half-close on; the peer may already be gone, which is fine.
            let _ = w.shutdown().await;
            return Ok(());
        }
        w.write_all(&buf[..n]).await.map_err(side_error)?;
        count.set(count.get() + n as u64);
        last.set(Instant::now());
    }
}

/// A relay failure is logged, not answered: who failed matters only for the log line.
fn side_error(e: io::Error) -> Error {
    Error::Upstream(e)
}
