//! The relay engine: bytes both ways between two sockets (CONNECT and SOCKS tunnels, port
//! relays, upgraded connections), lean when idle and cheap when busy.
//!
//! - No buffer while idle: a direction waits for readiness owning nothing, reads into the
//!   worker's scratch buffer and writes straight on; only when the destination takes less
//!   than was read does the rest go into a buffer from the worker's pool, returned as soon
//!   as it drains. A destination that does not read stops the reading (backpressure).
//! - splice(2) when data flows (`SpliceMode::Auto`): a direction moves to splicing through
//!   a pooled pipe once two reads in a row fill the scratch buffer, and back to copying
//!   after three small reads, so small exchanges keep the copy path's latency and bulk
//!   transfers never cross user space.
//! - Half-close: end of stream in one direction is passed on (shutdown of the write side)
//!   once everything read before it was delivered; the other direction keeps flowing.
//!   An error on either side ends both.
//! - One idle timer per relay, reset only when it fires.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::config::SpliceMode;
use crate::error::{Error, Phase};
use crate::sys::Pipe;

/// Scratch buffer size, and the read size that counts as "full" for switching to splice.
/// 16 KiB is what a busy socket usually has ready; two full reads in a row mean bulk.
pub const SCRATCH: usize = 16 * 1024;

/// Small reads in a row (in splice mode) after which a direction goes back to copying.
const SMALL_READS_TO_COPY: u32 = 3;

/// Full reads in a row (in copy mode) after which a direction starts splicing.
const FULL_READS_TO_SPLICE: u32 = 2;

/// Pipe capacity asked of the kernel: large enough that one splice moves what a fast
/// sender has queued; the default pipe-max-size (1 MiB) allows it unprivileged.
const PIPE_SIZE: usize = 1 << 20;

/// Idle pipes and spare buffers a worker keeps.
const MAX_SPARE: usize = 64;

/// How many times directions switched mode, process-wide (rare events; for tests and
/// diagnostics).
static TO_SPLICE: AtomicU64 = AtomicU64::new(0);
static TO_COPY: AtomicU64 = AtomicU64::new(0);

/// (switches to splice, switches back to copy) so far.
pub fn mode_switches() -> (u64, u64) {
    (TO_SPLICE.load(Ordering::Relaxed), TO_COPY.load(Ordering::Relaxed))
}

/// Optional grace delay (3proxy's `-g`): after `reads` small reads in a row, wait `delay`
/// before reading again so that data gathers into larger reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace {
    pub reads: u32,
    pub delay: Duration,
}

/// How a relay behaves.
#[derive(Debug, Clone, Copy)]
pub struct Opts {
    /// No byte either way for this long ends the relay.
    pub idle: Duration,
    pub splice: SpliceMode,
    pub grace: Option<Grace>,
}

/// What a relay moved.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    /// From the client towards the upstream.
    pub up: u64,
    /// From the upstream towards the client.
    pub down: u64,
}

/// A worker's relay resources: one scratch buffer, spare buffers for partial writes,
/// and idle pipes.
pub struct Pools {
    scratch: RefCell<Vec<u8>>,
    spare: RefCell<Vec<Vec<u8>>>,
    pipes: RefCell<Vec<Pipe>>,
    /// A pipe could not be made (fd limit): said once, then copying goes on.
    pipe_warned: Cell<bool>,
}

impl Default for Pools {
    fn default() -> Self {
        Pools {
            scratch: RefCell::new(vec![0; SCRATCH]),
            spare: RefCell::new(Vec::new()),
            pipes: RefCell::new(Vec::new()),
            pipe_warned: Cell::new(false),
        }
    }
}

impl Pools {
    fn park(&self, bytes: &[u8]) -> Vec<u8> {
        let mut v = self.spare.borrow_mut().pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(bytes);
        v
    }

    fn unpark(&self, v: Vec<u8>) {
        let mut spare = self.spare.borrow_mut();
        if spare.len() < MAX_SPARE && v.capacity() <= SCRATCH {
            spare.push(v);
        }
    }

    fn take_pipe(&self) -> Option<Pipe> {
        if let Some(p) = self.pipes.borrow_mut().pop() {
            return Some(p);
        }
        match Pipe::new(PIPE_SIZE) {
            Ok(p) => Some(p),
            Err(e) => {
                if !self.pipe_warned.replace(true) {
                    tracing::warn!("cannot create a pipe for splice ({e}); copying instead");
                }
                None
            }
        }
    }

    fn give_pipe(&self, p: Pipe) {
        // A pipe with bytes left in it belongs to a relay that failed: close it.
        let mut pipes = self.pipes.borrow_mut();
        if p.is_empty() && pipes.len() < MAX_SPARE {
            pipes.push(p);
        }
    }

    pub fn idle_pipes(&self) -> usize {
        self.pipes.borrow().len()
    }
}

/// Which socket an error came from decides whose fault it is.
#[derive(Debug, Clone, Copy)]
enum Side {
    Client,
    Upstream,
}

impl Side {
    fn err(self, e: io::Error) -> Error {
        match self {
            Side::Client => Error::Client(e),
            Side::Upstream => Error::Upstream(e),
        }
    }
}

/// Relays until both directions end. `early_up` and `early_down` are bytes already read
/// (beyond a parsed head) that go out first.
pub async fn run(
    pools: &Pools,
    client: &TcpStream,
    upstream: &TcpStream,
    early_up: &[u8],
    early_down: &[u8],
    opts: Opts,
) -> (Totals, Result<(), Error>) {
    let last = Cell::new(Instant::now());
    let up = Cell::new(0u64);
    let down = Cell::new(0u64);
    let a =
        one_way(pools, client, upstream, Side::Client, Side::Upstream, early_up, &up, &last, &opts);
    let b = one_way(
        pools,
        upstream,
        client,
        Side::Upstream,
        Side::Client,
        early_down,
        &down,
        &last,
        &opts,
    );
    tokio::pin!(a, b);
    let timer = tokio::time::sleep(opts.idle);
    tokio::pin!(timer);
    let (mut a_done, mut b_done) = (false, false);
    let result = loop {
        tokio::select! {
            r = &mut a, if !a_done => match r {
                Ok(()) if b_done => break Ok(()),
                Ok(()) => a_done = true,
                Err(e) => break Err(e),
            },
            r = &mut b, if !b_done => match r {
                Ok(()) if a_done => break Ok(()),
                Ok(()) => b_done = true,
                Err(e) => break Err(e),
            },
            () = &mut timer => {
                let quiet = last.get().elapsed();
                if quiet >= opts.idle {
                    break Err(Error::Timeout(Phase::TunnelIdle));
                }
                timer.as_mut().reset(tokio::time::Instant::now() + (opts.idle - quiet));
            }
        }
    };
    (Totals { up: up.get(), down: down.get() }, result)
}

#[allow(clippy::too_many_arguments)]
async fn one_way(
    pools: &Pools,
    src: &TcpStream,
    dst: &TcpStream,
    src_side: Side,
    dst_side: Side,
    early: &[u8],
    moved: &Cell<u64>,
    last: &Cell<Instant>,
    opts: &Opts,
) -> Result<(), Error> {
    if !early.is_empty() {
        write_all(dst, early).await.map_err(|e| dst_side.err(e))?;
        moved.set(moved.get() + early.len() as u64);
    }
    let mut splicing = opts.splice == SpliceMode::Always;
    let mut full = 0u32;
    let mut small = 0u32;
    let mut pipe: Option<Pipe> = None;
    let result = loop {
        if splicing {
            if pipe.is_none() {
                pipe = pools.take_pipe();
            }
            let Some(p) = pipe.as_mut() else {
                splicing = false;
                continue;
            };
            match splice_once(p, src, dst, src_side, dst_side, usize::MAX).await {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    moved.set(moved.get() + n as u64);
                    last.set(Instant::now());
                    small = if n < SCRATCH { small + 1 } else { 0 };
                    if opts.splice == SpliceMode::Auto && small >= SMALL_READS_TO_COPY {
                        splicing = false;
                        small = 0;
                        if let Some(p) = pipe.take() {
                            pools.give_pipe(p);
                        }
                        TO_COPY.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => break Err(e),
            }
        } else {
            if let Some(g) = opts.grace {
                if small >= g.reads {
                    tokio::time::sleep(g.delay).await;
                }
            }
            match copy_once(pools, src, dst, src_side, dst_side).await {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    moved.set(moved.get() + n as u64);
                    last.set(Instant::now());
                    if n == SCRATCH {
                        full += 1;
                        small = 0;
                    } else {
                        full = 0;
                        small += 1;
                    }
                    if opts.splice == SpliceMode::Auto && full >= FULL_READS_TO_SPLICE {
                        splicing = true;
                        full = 0;
                        TO_SPLICE.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => break Err(e),
            }
        }
    };
    if let Some(p) = pipe {
        pools.give_pipe(p);
    }
    result?;
    // Pass the half-close on. The peer may already be gone, which is fine.
    let _ = socket2::SockRef::from(dst).shutdown(std::net::Shutdown::Write);
    Ok(())
}

/// One read into the scratch buffer and its delivery. Returns the bytes moved, 0 at end
/// of stream.
async fn copy_once(
    pools: &Pools,
    src: &TcpStream,
    dst: &TcpStream,
    src_side: Side,
    dst_side: Side,
) -> Result<usize, Error> {
    loop {
        src.readable().await.map_err(|e| src_side.err(e))?;
        let (n, rest) = {
            let mut scratch = pools.scratch.borrow_mut();
            let n = match src.try_read(&mut scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(src_side.err(e)),
            };
            if n == 0 {
                return Ok(0);
            }
            if n < scratch.len() {
                drained(src);
            }
            let rest = match dst.try_write(&scratch[..n]) {
                Ok(m) if m == n => None,
                Ok(m) => Some(pools.park(&scratch[m..n])),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(pools.park(&scratch[..n])),
                Err(e) => return Err(dst_side.err(e)),
            };
            (n, rest)
        };
        if let Some(rest) = rest {
            // The destination is slower: hold what it has not taken, and read nothing
            // more until it has.
            let r = write_all(dst, &rest).await;
            pools.unpark(rest);
            r.map_err(|e| dst_side.err(e))?;
        }
        return Ok(n);
    }
}

/// Which socket failed in `splice_body`.
#[derive(Debug)]
pub enum SpliceFailure {
    Src(io::Error),
    Dst(io::Error),
}

/// Splices up to `max` bytes of an HTTP body from `src` to `dst`, once. `Ok(None)`: no
/// pipe could be had, so copy instead; `Ok(Some(0))`: the source ended.
pub async fn splice_body(
    pools: &Pools,
    src: &TcpStream,
    dst: &TcpStream,
    max: u64,
) -> Result<Option<usize>, SpliceFailure> {
    let Some(mut pipe) = pools.take_pipe() else { return Ok(None) };
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let result = splice_once(&mut pipe, src, dst, Side::Client, Side::Upstream, max).await;
    pools.give_pipe(pipe);
    match result {
        Ok(n) => Ok(Some(n)),
        Err(Error::Client(e)) => Err(SpliceFailure::Src(e)),
        Err(Error::Upstream(e)) => Err(SpliceFailure::Dst(e)),
        Err(other) => Err(SpliceFailure::Src(io::Error::other(other.to_string()))),
    }
}

/// One splice from the source into the pipe (at most `max` bytes), then out of the pipe
/// until it is empty.
async fn splice_once(
    pipe: &mut Pipe,
    src: &TcpStream,
    dst: &TcpStream,
    src_side: Side,
    dst_side: Side,
    max: usize,
) -> Result<usize, Error> {
    let n = loop {
        src.readable().await.map_err(|e| src_side.err(e))?;
        let room = pipe.room().min(max);
        match src.try_io(Interest::READABLE, || pipe.fill_up_to(src.as_fd(), max)) {
            Ok(0) => {
                // splice reports a connection reset as end of stream (the kernel checks
                // "done" before the pending error): look at the error before calling it
                // a clean close.
                if let Ok(Some(e)) = socket2::SockRef::from(src).take_error() {
                    return Err(src_side.err(e));
                }
                break 0;
            }
            Ok(n) => {
                if n < room {
                    drained(src);
                }
                break n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(src_side.err(e)),
        }
    };
    while !pipe.is_empty() {
        dst.writable().await.map_err(|e| dst_side.err(e))?;
        match dst.try_io(Interest::WRITABLE, || pipe.drain(dst.as_fd())) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(dst_side.err(e)),
        }
    }
    Ok(n)
}

/// A read that returned less than asked for emptied the socket: clear tokio's cached
/// readiness without a syscall, so the next wait goes to epoll instead of trying a read
/// that would only say EAGAIN (tokio's own poll_read does the same).
fn drained(s: &TcpStream) {
    let _ = s.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
}

async fn write_all(dst: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        dst.writable().await?;
        match dst.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
