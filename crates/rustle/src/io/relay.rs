//! The relay engine: bytes both ways between two ends (CONNECT and SOCKS tunnels, port
//! relays, upgraded connections, HTTP/2 CONNECT streams), lean when idle and cheap when
//! busy. One state machine per direction, generic over the ends (`End`): sockets splice
//! and take a low-water mark, TLS streams are flushed, an HTTP/2 stream gives its window
//! as room and its reset; each pair of ends is compiled on its own, so no end pays for
//! another's capability.
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
//! - One idle deadline per relay, moved only when it fires: on a worker, a slot in the
//!   worker's coarse registry (`idle::Coarse`), swept every 100 ms; elsewhere a tokio timer.
//!   Both read tokio's clock, so tests run them on paused time.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant, Sleep};

use crate::config::SpliceMode;
use crate::error::{Error, Phase};
use crate::io::sys::Pipe;
use crate::limits::{Direction, Limit, Throttle, UserTraffic};
pub(crate) use end::End;
use kernel::{Drain, Forwarding, State};

/// Scratch buffer size, and the read size that counts as "full" for switching to splice.
/// 16 KiB is what a busy socket usually has ready; two full reads in a row mean bulk.
pub(crate) const SCRATCH: usize = 16 * 1024;

/// Small reads in a row (in splice mode) after which a direction goes back to copying.
const SMALL_READS_TO_COPY: u32 = 3;

/// Full reads in a row (in copy mode) after which a direction starts splicing.
const FULL_READS_TO_SPLICE: u32 = 2;

/// Pipe capacity asked of the kernel: large enough that one splice moves what a fast
/// sender has queued; the default pipe-max-size (1 MiB) allows it unprivileged.
const PIPE_SIZE: usize = 1 << 20;

/// With a grace delay, a splicing direction asks to be woken only once this much is
/// queued (SO_RCVLOWAT), and reads what is there anyway after the delay: a sender slower
/// than the proxy is then read in large pieces rather than a wakeup, a splice in and a
/// splice out for each few segments, and the tail of a burst waits at most the delay.
const LOWAT: usize = 256 * 1024;

/// Idle pipes and spare buffers a worker keeps.
const MAX_SPARE: usize = 64;

/// How many times directions switched mode (rare events; for tests and diagnostics).
/// Each thread's relays count into the thread's own, or into their proxy's once its
/// worker thread said so (`count_switches_in`): one proxy, or one test, sees its own
/// relays only.
#[derive(Debug, Default)]
pub(crate) struct Switches {
    to_splice: AtomicU64,
    to_copy: AtomicU64,
    /// Tunnels handed to the kernel (`kernel`), and those it gave back.
    to_kernel: AtomicU64,
    from_kernel: AtomicU64,
}

impl Switches {
    /// (switches to splice, switches back to copy) so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (self.to_splice.load(Ordering::Relaxed), self.to_copy.load(Ordering::Relaxed))
    }

    /// (tunnels handed to the kernel, tunnels it gave back) so far.
    pub(crate) fn kernel(&self) -> (u64, u64) {
        (self.to_kernel.load(Ordering::Relaxed), self.from_kernel.load(Ordering::Relaxed))
    }
}

/// The relays of this thread count their mode switches in `switches` from now on.
pub(crate) fn count_switches_in(switches: Arc<Switches>) {
    POOLS.with(|p| *p.switches.borrow_mut() = switches);
}

/// (switches to splice, switches back to copy) of this thread's relays so far (a test
/// hook: the proxy's own count is `server::Running::mode_switches`).
#[cfg(test)]
pub(crate) fn mode_switches() -> (u64, u64) {
    POOLS.with(|p| p.switches.borrow().get())
}

/// Optional grace delay (3proxy's `-g`): after `reads` small reads in a row, wait `delay`
/// before reading again so that data gathers into larger reads. While splicing, a
/// direction is woken only once `LOWAT` bytes are queued, or `delay` after it last
/// waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grace {
    pub(crate) reads: u32,
    pub(crate) delay: Duration,
}

/// How a relay behaves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opts {
    /// No byte either way for this long ends the relay.
    pub(crate) idle: Duration,
    pub(crate) splice: SpliceMode,
    pub(crate) grace: Option<Grace>,
}

/// What a relay moved.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    /// From the client towards the upstream.
    pub(crate) up: u64,
    /// From the upstream towards the client.
    pub(crate) down: u64,
}

thread_local! {
    /// Each worker is a thread: its relays share these without locks.
    static POOLS: Pools = Pools::default();
}

/// Idle pipes this thread's pool holds (a test hook).
#[cfg(test)]
pub(crate) fn idle_pipes() -> usize {
    POOLS.with(|p| p.pipes.borrow().len())
}

/// Splices from a socket into a pipe on this thread so far, and the bytes they moved (a
/// test hook: how much one splice moves).
#[cfg(test)]
pub(crate) fn splice_reads() -> (u64, u64) {
    POOLS.with(|p| p.splice_reads.get())
}

/// A worker's relay resources: one scratch buffer, spare buffers for partial writes,
/// and idle pipes.
struct Pools {
    scratch: RefCell<Vec<u8>>,
    spare: RefCell<Vec<Vec<u8>>>,
    pipes: RefCell<Vec<Pipe>>,
    /// A pipe could not be made (fd limit): said once, then copying goes on.
    pipe_warned: Cell<bool>,
    /// (splices into a pipe, bytes they moved)
    #[cfg(test)]
    splice_reads: Cell<(u64, u64)>,
    switches: RefCell<Arc<Switches>>,
}

impl Default for Pools {
    fn default() -> Self {
        Pools {
            scratch: RefCell::new(vec![0; SCRATCH]),
            spare: RefCell::new(Vec::new()),
            pipes: RefCell::new(Vec::new()),
            pipe_warned: Cell::new(false),
            #[cfg(test)]
            splice_reads: Cell::new((0, 0)),
            switches: RefCell::new(Arc::default()),
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
}

/// Which socket an error came from decides whose fault it is.
#[derive(Debug, Clone, Copy)]
enum Side {
    Client,
    Upstream,
}

/// What an end fails with when its destination's window stays shut past its stall time
/// (`End::poll_room`): the relay's error is then a write timeout, not an I/O error.
#[derive(Debug)]
pub(crate) struct Stalled;

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client's window stayed shut")
    }
}

impl std::error::Error for Stalled {}

/// The error a tunnel cut by its user's quota ends with.
#[cold]
fn cut(t: &UserTraffic) -> Error {
    t.over_quota().unwrap_or(Error::QuotaExceeded("quota used up".into()))
}

impl Side {
    /// The direction of the bytes this side sends.
    fn direction(self) -> Direction {
        match self {
            Side::Client => Direction::Up,
            Side::Upstream => Direction::Down,
        }
    }

    /// The side's socket in a forwarded tunnel's slots (`kernel`).
    fn index(self) -> usize {
        match self {
            Side::Client => 0,
            Side::Upstream => 1,
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Client => Side::Upstream,
            Side::Upstream => Side::Client,
        }
    }

    fn err(self, e: io::Error) -> Error {
        if e.get_ref().is_some_and(|inner| inner.is::<Stalled>()) {
            return Error::Timeout(Phase::ClientWrite);
        }
        match self {
            Side::Client => Error::Client(e),
            Side::Upstream => Error::Upstream(e),
        }
    }
}

/// Bytes a destination has not taken yet, in a buffer from the pool.
struct Pending {
    buf: Vec<u8>,
    off: usize,
}

/// One direction of a relay. Small on purpose: an idle tunnel is two of these.
struct Dir {
    /// The source's side; the destination is the other one.
    src: Side,
    splicing: bool,
    /// Bytes went to a destination that needs flushing (not a socket) since its flush.
    dirty: bool,
    /// Reads in a row that filled the scratch buffer (copy mode).
    full: u8,
    /// Small reads in a row.
    small: u8,
    pending: Option<Pending>,
    pipe: Option<Pipe>,
    /// The source ended: pass it on once everything before it is delivered.
    eof: bool,
    done: bool,
    /// The source's receive low-water mark (see `LOWAT`).
    lowat: Lowat,
    moved: u64,
    /// A pause before the next read: the grace delay, or a bandwidth limit's wait; while
    /// the low-water mark is set, the nudge timer. Allocated only while in use.
    pause: Option<Pin<Box<Sleep>>>,
}

/// Whether a direction's source has the low-water mark set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lowat {
    /// Not set (copying, or no mark wanted).
    Off,
    /// Set; no nudge timer for the current wait yet.
    Set,
    /// Set, and the nudge timer runs for the current wait.
    Waiting,
    /// Splicing, but a nudge found nothing: the mark is dropped until a large read.
    Quiet,
}

impl Dir {
    /// `splice`: both ends are sockets (`End::SOCKET`), so this direction may splice.
    fn new(src: Side, opts: &Opts, splice: bool, early: &[u8], pools: &Pools) -> Dir {
        Dir {
            src,
            splicing: splice && opts.splice == SpliceMode::Always,
            dirty: false,
            full: 0,
            small: 0,
            pending: (!early.is_empty()).then(|| Pending { buf: pools.park(early), off: 0 }),
            pipe: None,
            eof: false,
            done: false,
            lowat: Lowat::Off,
            moved: early.len() as u64,
            pause: None,
        }
    }

    // Both ends, the pools, the settings, the limit, the activity clock and whether
    // the sockets close when this direction ends (`last_out`: the other one has ended and
    // the relay owns them) are each needed here; a struct for them would exist only to
    // shorten this list.
    #[allow(clippy::too_many_arguments)]
    /// Moves bytes until the source has nothing more for now (Pending), the direction
    /// ends (Ready(Ok)), or an end fails. Splicing, the low-water mark and the grace
    /// delay need two sockets (`End::SOCKET`); flushing, an end that is not one.
    fn poll_move<S: End, D: End>(
        &mut self,
        cx: &mut Context<'_>,
        pools: &Pools,
        src: &mut S,
        dst: &mut D,
        opts: &Opts,
        limit: Option<&Limit>,
        last: &mut Instant,
        last_out: bool,
        user: Option<&UserTraffic>,
        mut left: Option<&mut Forwarding>,
    ) -> Poll<Result<(), Error>> {
        let sockets = S::SOCKET && D::SOCKET;
        loop {
            // Deliver what is held first: nothing more is read until it is gone.
            if let Some(p) = &mut self.pending {
                match ready!(dst.poll_write(cx, &p.buf[p.off..])) {
                    Ok(0) => {
                        return Poll::Ready(Err(self
                            .src
                            .other()
                            .err(io::ErrorKind::WriteZero.into())))
                    }
                    Ok(n) => p.off += n,
                    Err(e) => return Poll::Ready(Err(self.src.other().err(e))),
                }
                self.dirty = !D::SOCKET;
                if p.off == p.buf.len() {
                    if let Some(p) = self.pending.take() {
                        pools.unpark(p.buf);
                    }
                }
                continue;
            }
            if let (Some(pipe), Some(out)) =
                (self.pipe.as_mut().filter(|p| !p.is_empty()), dst.socket())
            {
                ready!(out.poll_write_ready(cx)).map_err(|e| self.src.other().err(e))?;
                match out.try_io(Interest::WRITABLE, || pipe.drain(out.as_fd())) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(self.src.other().err(e))),
                }
                continue;
            }
            if !self.splicing {
                if let Some(p) = self.pipe.take() {
                    pools.give_pipe(p);
                }
            }
            if self.eof {
                if let Some(p) = self.pipe.take() {
                    pools.give_pipe(p);
                }
                if !D::SOCKET {
                    ready!(dst.poll_flush(cx)).map_err(|e| self.src.other().err(e))?;
                    self.dirty = false;
                }
                // Pass the half-close on (a TLS close_notify, then FIN). The peer may
                // already be gone, which is fine. When this is the last direction and the
                // sockets are closed right after, close sends the FIN: one syscall less
                // per connection.
                if !last_out {
                    let _ = ready!(dst.poll_shutdown(cx));
                }
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            let mut forced = false;
            if let Some(s) = src.socket().filter(|_| sockets) {
                // With a grace delay, splicing sets the low-water mark (and a bandwidth
                // limit, which has pauses of its own, does not); copying clears it.
                let want_lowat = self.splicing && limit.is_none() && opts.grace.is_some();
                match (want_lowat, self.lowat) {
                    (true, Lowat::Off) => {
                        // Refused: tried again after the next large read.
                        self.lowat = match crate::io::sys::set_rcvlowat(s, LOWAT) {
                            Ok(()) => Lowat::Set,
                            Err(_) => Lowat::Quiet,
                        };
                    }
                    (false, Lowat::Set | Lowat::Waiting) => {
                        // Lowering a socket option on an open TCP socket does not fail; if
                        // it did, the next nudge-less wait would show it as a stall.
                        let _ = crate::io::sys::set_rcvlowat(s, 1);
                        self.lowat = Lowat::Off;
                        self.pause = None;
                    }
                    (false, Lowat::Quiet) => self.lowat = Lowat::Off,
                    _ => {}
                }
            }
            if matches!(self.lowat, Lowat::Off | Lowat::Quiet) {
                if let Some(sleep) = &mut self.pause {
                    ready!(sleep.as_mut().poll(cx));
                    self.pause = None;
                }
                ready!(src.poll_read_ready(cx)).map_err(|e| self.src.err(e))?;
            } else {
                match src.poll_read_ready(cx) {
                    Poll::Ready(r) => {
                        r.map_err(|e| self.src.err(e))?;
                        self.lowat = Lowat::Set;
                    }
                    Poll::Pending => {
                        if self.lowat == Lowat::Set {
                            let nudge = opts.grace.map_or(Duration::ZERO, |g| g.delay);
                            let deadline = Instant::now() + nudge;
                            match &mut self.pause {
                                Some(sleep) => sleep.as_mut().reset(deadline),
                                None => self.pause = Some(Box::pin(sleep_until(deadline))),
                            }
                            self.lowat = Lowat::Waiting;
                        }
                        if let Some(sleep) = &mut self.pause {
                            ready!(sleep.as_mut().poll(cx));
                        }
                        // Fewer bytes than the mark have waited a nudge: read them.
                        self.lowat = Lowat::Set;
                        forced = true;
                    }
                }
            }
            // A bandwidth limit grants bytes only once there is something to read, so an
            // idle tunnel holds no tokens. Unlimited, a splice moves what the pipe takes;
            // a copy, what the scratch buffer and the destination's room take.
            let mut allowed = if self.splicing {
                usize::MAX
            } else {
                ready!(dst.poll_room(cx, SCRATCH)).map_err(|e| self.src.other().err(e))?
            };
            if let Some(limit) = limit {
                let now = Instant::now();
                allowed = limit.take(allowed.min(SCRATCH), now.into_std());
                if allowed == 0 {
                    dst.release_room();
                    let wait = limit.wait(SCRATCH, now.into_std());
                    self.pause = Some(Box::pin(sleep_until(now + wait)));
                    continue;
                }
            }
            let unused = |got: usize| {
                if let Some(limit) = limit {
                    limit.give_back(allowed - got.min(allowed));
                }
            };
            let n = match (src.socket().filter(|_| self.splicing), dst.socket()) {
                (Some(from), Some(_)) => {
                    if self.pipe.is_none() {
                        self.pipe = pools.take_pipe();
                    }
                    let Some(pipe) = self.pipe.as_mut() else {
                        self.splicing = false;
                        continue;
                    };
                    let room = pipe.room().min(allowed);
                    let result = if forced {
                        // tokio does not see the socket as readable (the mark held its
                        // wakeup back): read it directly.
                        pipe.fill_up_to(from.as_fd(), room)
                    } else {
                        from.try_io(Interest::READABLE, || pipe.fill_up_to(from.as_fd(), room))
                    };
                    unused(*result.as_ref().unwrap_or(&0));
                    match result {
                        Ok(0) => {
                            // splice reports a reset as end of stream (the kernel checks
                            // "done" before the pending error): look before calling it
                            // clean.
                            if let Ok(Some(e)) = socket2::SockRef::from(from).take_error() {
                                return Poll::Ready(Err(self.src.err(e)));
                            }
                            0
                        }
                        Ok(n) => {
                            #[cfg(test)]
                            {
                                let (calls, bytes) = pools.splice_reads.get();
                                pools.splice_reads.set((calls + 1, bytes + n as u64));
                            }
                            // A short splice does not mean the socket is empty: the pipe
                            // has a slot per fragment (256 of 1.5 KB segments fill 384 KB
                            // of a 1 MiB pipe). Only the next splice's WouldBlock says so.
                            if n >= SCRATCH && self.lowat == Lowat::Quiet {
                                // Bulk again: set the mark on the next wait.
                                self.lowat = Lowat::Off;
                            }
                            n
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if forced {
                                // Nothing came: the burst is over. Every byte wakes the
                                // direction again until the next large read, and this
                                // counts as a small read.
                                let _ = crate::io::sys::set_rcvlowat(from, 1);
                                self.lowat = Lowat::Quiet;
                                self.pause = None;
                                self.count(0, opts);
                            }
                            continue;
                        }
                        Err(e) => return Poll::Ready(Err(self.src.err(e))),
                    }
                }
                _ => {
                    let mut scratch = pools.scratch.borrow_mut();
                    let want = allowed.min(scratch.len());
                    let n = match src.poll_read(cx, &mut scratch[..want]) {
                        Poll::Ready(Ok(n)) => n,
                        Poll::Ready(Err(e)) => {
                            unused(0);
                            return Poll::Ready(Err(self.src.err(e)));
                        }
                        Poll::Pending => {
                            unused(0);
                            dst.release_room();
                            // Nothing more for now: what went to a TLS destination leaves
                            // rustls rather than waiting for the next bytes.
                            if self.dirty {
                                match dst.poll_flush(cx) {
                                    Poll::Ready(Ok(())) => self.dirty = false,
                                    Poll::Ready(Err(e)) => {
                                        return Poll::Ready(Err(self.src.other().err(e)))
                                    }
                                    Poll::Pending => {}
                                }
                            }
                            return Poll::Pending;
                        }
                    };
                    unused(n);
                    if n > 0 {
                        let taken = match dst.poll_write(cx, &scratch[..n]) {
                            Poll::Ready(Ok(m)) => m,
                            Poll::Ready(Err(e)) => {
                                return Poll::Ready(Err(self.src.other().err(e)))
                            }
                            Poll::Pending => 0,
                        };
                        if taken < n {
                            // The destination is slower: hold the rest, read nothing more.
                            self.pending =
                                Some(Pending { buf: pools.park(&scratch[taken..n]), off: 0 });
                        }
                        self.dirty = !D::SOCKET;
                    }
                    n
                }
            };
            if n == 0 {
                // A tunnel the kernel gave back: its socket says end of stream as soon as
                // the FIN came, while data the program passed up before it may still be
                // on its way to the reader.
                if left.as_deref().is_some_and(|f| f.unread(self.src.index()) > 0) {
                    self.pause = Some(Box::pin(sleep_until(Instant::now() + kernel::DRAIN_POLL)));
                    continue;
                }
                self.eof = true;
                continue;
            }
            if let Some(f) = left.as_deref_mut() {
                f.took(self.src.index(), n);
            }
            self.moved += n as u64;
            if let Some(t) = user {
                // The user's quota counts bytes as they move (one relaxed add), and a
                // quota that closes open tunnels ends this one at its next read.
                t.add(self.src.direction(), n as u64);
                if t.cut() {
                    return Poll::Ready(Err(cut(t)));
                }
            }
            *last = Instant::now();
            if sockets {
                self.count(n, opts);
            }
        }
    }

    // As `poll_move`, with the tunnel's slots in place of the limit and the settings.
    #[allow(clippy::too_many_arguments)]
    /// The kernel path (`kernel`): the program moves the bytes. This direction passes its
    /// end of stream on and writes what the program passed up, each only once the
    /// destination has sent what was redirected before it.
    fn poll_kernel<S: End, D: End>(
        &mut self,
        cx: &mut Context<'_>,
        pools: &Pools,
        src: &mut S,
        dst: &mut D,
        fwd: &mut Forwarding,
        last: &mut Instant,
        last_out: bool,
        user: Option<&UserTraffic>,
    ) -> Poll<Result<(), Error>> {
        let i = self.src.index();
        loop {
            if self.pending.is_some() || self.eof {
                if let Some(out) = dst.socket() {
                    // Looked at again after 1, 2, 4... ms, at most every 64 ms while a
                    // slow receiver takes what was queued (`full` counts the steps here).
                    let drain = fwd.drained(i, out).map_err(|e| self.src.other().err(e))?;
                    if drain == Drain::Moving {
                        *last = Instant::now();
                    }
                    if drain == Drain::Done {
                        self.pause = None;
                        self.full = 0;
                    } else {
                        let sleep = self.pause.get_or_insert_with(|| {
                            let wait = kernel::DRAIN_POLL * (1 << self.full.min(6));
                            Box::pin(sleep_until(Instant::now() + wait))
                        });
                        ready!(sleep.as_mut().poll(cx));
                        self.pause = None;
                        self.full = self.full.saturating_add(1);
                        continue;
                    }
                }
            }
            if let Some(p) = &mut self.pending {
                match ready!(dst.poll_write(cx, &p.buf[p.off..])) {
                    Ok(0) => {
                        return Poll::Ready(Err(self
                            .src
                            .other()
                            .err(io::ErrorKind::WriteZero.into())))
                    }
                    Ok(n) => {
                        p.off += n;
                        fwd.wrote(self.src.other().index(), n);
                    }
                    Err(e) => return Poll::Ready(Err(self.src.other().err(e))),
                }
                if p.off == p.buf.len() {
                    if let Some(p) = self.pending.take() {
                        pools.unpark(p.buf);
                    }
                    fwd.open_gate(i);
                }
                continue;
            }
            if self.eof {
                if !last_out {
                    let _ = ready!(dst.poll_shutdown(cx));
                }
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            ready!(src.poll_read_ready(cx)).map_err(|e| self.src.err(e))?;
            let mut scratch = pools.scratch.borrow_mut();
            let n = match src.poll_read(cx, &mut scratch[..]) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.src.err(e))),
                Poll::Pending => return Poll::Pending,
            };
            // What comes now went past the program: it waits for the destination.
            fwd.hold(i);
            if n == 0 {
                // The socket says end of stream once the FIN came, while data the program
                // passed up before it may still be queued for the reader: wait for it.
                if fwd.unread(i) > 0 {
                    let step = self.full.min(6);
                    let sleep = self.pause.get_or_insert_with(|| {
                        Box::pin(sleep_until(Instant::now() + kernel::DRAIN_POLL * (1 << step)))
                    });
                    ready!(sleep.as_mut().poll(cx));
                    self.pause = None;
                    self.full = self.full.saturating_add(1);
                    continue;
                }
                self.eof = true;
                continue;
            }
            fwd.took(i, n);
            self.pending = Some(Pending { buf: pools.park(&scratch[..n]), off: 0 });
            drop(scratch);
            self.moved += n as u64;
            if let Some(t) = user {
                t.add(self.src.direction(), n as u64);
                if t.cut() {
                    return Poll::Ready(Err(cut(t)));
                }
            }
            *last = Instant::now();
        }
    }

    /// The switching rules of the automatic mode, and the grace delay.
    fn count(&mut self, n: usize, opts: &Opts) {
        if self.splicing {
            self.small = if n < SCRATCH { self.small.saturating_add(1) } else { 0 };
            if opts.splice == SpliceMode::Auto && u32::from(self.small) >= SMALL_READS_TO_COPY {
                self.splicing = false;
                self.small = 0;
                POOLS.with(|p| p.switches.borrow().to_copy.fetch_add(1, Ordering::Relaxed));
            }
            return;
        }
        if n == SCRATCH {
            self.full = self.full.saturating_add(1);
            self.small = 0;
        } else {
            self.full = 0;
            self.small = self.small.saturating_add(1);
        }
        if opts.splice == SpliceMode::Auto && u32::from(self.full) >= FULL_READS_TO_SPLICE {
            self.splicing = true;
            self.full = 0;
            POOLS.with(|p| p.switches.borrow().to_splice.fetch_add(1, Ordering::Relaxed));
        }
        if let Some(g) = opts.grace {
            if u32::from(self.small) >= g.reads {
                self.pause = Some(Box::pin(tokio::time::sleep(g.delay)));
            }
        }
    }

    /// Ended, or waiting for its source with nothing held.
    fn quiescent(&self) -> bool {
        self.done
            || (self.pending.is_none()
                && self.pipe.as_ref().is_none_or(Pipe::is_empty)
                && self.pause.is_none()
                && !self.eof
                && matches!(self.lowat, Lowat::Off | Lowat::Quiet))
    }

    fn release(&mut self, pools: &Pools) {
        if let Some(p) = self.pending.take() {
            pools.unpark(p.buf);
        }
        if let Some(p) = self.pipe.take() {
            pools.give_pipe(p);
        }
    }
}

/// A relay between two sockets; resolves when both directions have ended, one side
/// failed, or the idle timeout passed. Hand-written rather than `async` so that the state
/// an open tunnel keeps is two small `Dir`s, with no readiness futures inside.
pub(crate) struct Relay<C, U> {
    client: C,
    upstream: U,
    /// Bandwidth limits and the user's counters; None (no cost) for an unlimited
    /// connection without a user.
    extras: Option<Box<Extras>>,
    up: Dir,
    down: Dir,
    opts: Opts,
    last: Instant,
    timer: IdleTimer,
    /// The sockets are closed as soon as the relay ends (see `closing`).
    closes: bool,
    /// The relay says when it has been idle long enough to be parked (see `parking`).
    parks: bool,
    /// Whether and when the relay hands the tunnel to the kernel (see `forwarded`).
    to_kernel: ToKernel,
}

/// When a relay hands its tunnel to the kernel (`kernel`): at the first moment it holds
/// nothing, or once it has also moved `kernel::ENTER_AFTER` bytes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToKernel {
    No,
    Now,
    Busy,
}

/// What only some relays have, boxed so that the others keep one word for it (an open
/// tunnel's task stays within tokio's 640-byte size class).
#[derive(Default)]
struct Extras {
    /// Bandwidth limits (`throttled`); None: unlimited.
    throttle: Option<Throttle>,
    /// The user's shared counters (`counting`): bytes are added as they move.
    user: Option<Arc<UserTraffic>>,
    /// The tunnel's slots while the kernel forwards it (`kernel`).
    kernel: Option<Forwarding>,
}

impl Extras {
    /// The bytes the kernel moved since the last look go to the user's counters.
    fn account(&mut self) {
        if let (Some(k), Some(t)) = (&mut self.kernel, &self.user) {
            let (up, down) = k.unaccounted();
            t.add(Direction::Up, up);
            t.add(Direction::Down, down);
        }
    }

    /// (up, down) the kernel moved.
    fn forwarded(&self) -> (u64, u64) {
        self.kernel.as_ref().map_or((0, 0), |k| (k.redirected(0), k.redirected(1)))
    }
}

/// A tunnel that has moved no byte for this long is parked (see `park`), unless its
/// idle timeout comes first.
pub(crate) const PARK_AFTER: Duration = Duration::from_secs(1);

/// How a relay ended.
pub(crate) enum Ended {
    /// Both directions ended, one side failed, or the idle timeout passed.
    Done(Totals, Result<(), Error>),
    /// Nothing has moved for `PARK_AFTER` and nothing is held: the relay can be parked.
    Idle,
    /// The kernel forwards the tunnel and a new policy is in force on this thread: its
    /// owner looks at its limits again (`leave`), then polls on.
    Reload,
}

/// What a parked relay keeps to go on where it stopped.
pub(crate) struct Resume {
    opts: Opts,
    extras: Option<Box<Extras>>,
    moved: (u64, u64),
    done: (bool, bool),
    last: Instant,
}

impl Resume {
    /// When the idle timeout ends the parked relay.
    pub(crate) fn deadline(&self) -> Instant {
        self.last + self.opts.idle.min(crate::config::MAX_DURATION)
    }

    pub(crate) fn totals(&self) -> Totals {
        let (up, down) = self.extras.as_deref().map_or((0, 0), Extras::forwarded);
        Totals { up: self.moved.0 + up, down: self.moved.1 + down }
    }

    /// A tunnel the kernel forwards (the park's sweep looks at it every second): its idle
    /// clock moves on if the kernel moved bytes, and those go to its user's counters.
    /// Returns the worker's reload count the tunnel last saw, to compare and update; None
    /// for a tunnel the relay moves.
    /// Also says whether the kernel moved bytes since the last look.
    pub(crate) fn forwarded(&mut self, now: Instant) -> Option<(&mut u64, bool)> {
        let e = self.extras.as_deref_mut()?;
        e.account();
        let k = e.kernel.as_mut().filter(|k| k.state == State::Kernel)?;
        let moved = k.moved_since();
        if moved {
            self.last = now;
        }
        Some((&mut k.reloads, moved))
    }

    /// The tunnel leaves the kernel path with these limits (a reload gave it some).
    pub(crate) fn leave(&mut self, throttle: &Throttle) {
        let e = self.extras.get_or_insert_with(Box::default);
        e.throttle = Some(throttle.clone());
        if let Some(k) = e.kernel.as_mut().filter(|k| k.state == State::Kernel) {
            k.leave();
            POOLS.with(|p| p.switches.borrow().from_kernel.fetch_add(1, Ordering::Relaxed));
        }
    }

    /// Which directions (client to upstream, upstream to client) have ended.
    pub(crate) fn done(&self) -> (bool, bool) {
        self.done
    }

    /// The user's quota says to end its open tunnels (the park's sweep looks).
    pub(crate) fn cut(&self) -> Option<Error> {
        let user = self.extras.as_ref().and_then(|e| e.user.as_deref());
        user.filter(|t| t.cut()).map(cut)
    }
}

/// Relays until both directions end. `early_up` and `early_down` are bytes already read
/// (beyond a parsed head) that go out first.
/// The ends may be sockets, owned (a tunnel task) or borrowed, or streams with TLS on
/// them (see `End`).
pub(crate) fn run<C, U>(
    client: C,
    upstream: U,
    early_up: &[u8],
    early_down: &[u8],
    opts: Opts,
) -> Relay<C, U>
where
    C: End + Unpin,
    U: End + Unpin,
{
    let splice = C::SOCKET && U::SOCKET;
    let (up, down) = POOLS.with(|pools| {
        (
            Dir::new(Side::Client, &opts, splice, early_up, pools),
            Dir::new(Side::Upstream, &opts, splice, early_down, pools),
        )
    });
    Relay {
        client,
        upstream,
        extras: None,
        up,
        down,
        opts,
        last: Instant::now(),
        timer: IdleTimer::Unarmed,
        closes: false,
        parks: false,
        to_kernel: ToKernel::No,
    }
}

impl<C, U> Relay<C, U> {
    /// Applies bandwidth limits (nothing is kept for an unlimited throttle).
    pub(crate) fn throttled(mut self, throttle: &Throttle) -> Self {
        if !throttle.is_unlimited() {
            self.extras.get_or_insert_with(Box::default).throttle = Some(throttle.clone());
        }
        self
    }

    /// Adds the bytes the relay moves (those handed to it included) to the user's
    /// counters as they move: `exchange::end` then counts only the rest of the exchange.
    pub(crate) fn counting(mut self, user: Option<Arc<UserTraffic>>) -> Self {
        if let Some(t) = user {
            t.add(Direction::Up, self.up.moved);
            t.add(Direction::Down, self.down.moved);
            self.extras.get_or_insert_with(Box::default).user = Some(t);
        }
        self
    }

    /// Says that the sockets are closed as soon as the relay ends (a tunnel task owns
    /// them): the last end of stream is then passed on by that close, not by a shutdown.
    pub(crate) fn closing(mut self) -> Self {
        self.closes = true;
        self
    }

    fn totals(&self) -> Totals {
        let (up, down) = self.extras.as_deref().map_or((0, 0), Extras::forwarded);
        Totals { up: self.up.moved + up, down: self.down.moved + down }
    }

    /// The two ends (an HTTP/2 tunnel resets its stream once the relay has ended).
    pub(crate) fn ends_mut(&mut self) -> (&mut C, &mut U) {
        (&mut self.client, &mut self.upstream)
    }

    /// `n` bytes went to the client before the relay ran (an upstream's first bytes sent
    /// with a response head): counted, and charged to the bandwidth limits.
    pub(crate) fn sent_down_before(&mut self, n: usize) {
        self.down.moved += n as u64;
        let Some(e) = &self.extras else { return };
        if let Some(t) = &e.user {
            t.add(Direction::Down, n as u64);
        }
        if let Some(t) = &e.throttle {
            t.charge(crate::limits::Direction::Down, n, Instant::now().into_std());
        }
    }

    /// Nothing held in either direction: no bytes waiting for a slow destination, no
    /// pause, no low-water mark; the relay only waits for its sockets.
    fn quiescent(&self) -> bool {
        self.up.quiescent() && self.down.quiescent()
    }
}

impl<C: End, U: End> Relay<C, U> {
    /// After the relay ended with `result`: a side that reset the connection gets the
    /// other side reset too (SO_LINGER 0, so that closing sends RST), where a plain close
    /// would tell that peer the stream ended whole. Once per tunnel, at its end; only
    /// between sockets.
    pub(crate) fn pass_reset(&self, result: &Result<(), Error>) {
        let reset = |e: &io::Error| e.kind() == io::ErrorKind::ConnectionReset;
        let other = match result {
            Err(Error::Upstream(e)) if reset(e) => self.client.socket(),
            Err(Error::Client(e)) if reset(e) => self.upstream.socket(),
            _ => return,
        };
        let Some(other) = other else { return };
        if let Err(e) = socket2::SockRef::from(other).set_linger(Some(Duration::ZERO)) {
            tracing::debug!("SO_LINGER 0 to pass a reset on: {e}");
        }
    }
}

impl Relay<TcpStream, TcpStream> {
    /// Lets the relay end with `Ended::Idle` once it has been idle for `PARK_AFTER`.
    pub(crate) fn parking(mut self) -> Self {
        self.parks = true;
        self
    }

    /// The tunnel leaves the kernel path with these limits (a reload gave it some); the
    /// next poll hands over to the relay.
    pub(crate) fn leave(&mut self, throttle: &Throttle) {
        let e = self.extras.get_or_insert_with(Box::default);
        e.throttle = Some(throttle.clone());
        if let Some(k) = e.kernel.as_mut().filter(|k| k.state == State::Kernel) {
            k.leave();
            POOLS.with(|p| p.switches.borrow().from_kernel.fetch_add(1, Ordering::Relaxed));
        }
    }

    /// Whether the relay may be parked (`parking`).
    pub(crate) fn parks(&self) -> bool {
        self.parks
    }

    /// Hands the tunnel to the kernel (`kernel`) once the bytes handed to the relay are
    /// delivered, where the kernel path is on (`mode`) and the tunnel has no bandwidth
    /// limit.
    pub(crate) fn forwarded(mut self, mode: crate::config::KernelForwarding) -> Self {
        let limited = self.extras.as_ref().is_some_and(|e| e.throttle.is_some());
        self.to_kernel = match mode {
            _ if limited || !kernel::enabled(mode) => ToKernel::No,
            crate::config::KernelForwarding::Require => ToKernel::Now,
            _ => ToKernel::Busy,
        };
        self
    }

    /// Takes an idle relay apart for parking: its sockets, off tokio's event loop, and
    /// what it needs to resume. On failure, what it had moved and the error.
    #[allow(clippy::type_complexity)]
    pub(crate) fn park(
        mut self,
    ) -> Result<(std::net::TcpStream, std::net::TcpStream, Resume), (Totals, Error)> {
        POOLS.with(|pools| {
            self.up.release(pools);
            self.down.release(pools);
        });
        let totals = self.totals();
        let resume = Resume {
            opts: self.opts,
            extras: self.extras.take(),
            moved: (self.up.moved, self.down.moved),
            done: (self.up.done, self.down.done),
            last: self.last,
        };
        let client = self.client.into_std().map_err(|e| (totals, Error::Client(e)))?;
        let upstream = self.upstream.into_std().map_err(|e| (totals, Error::Upstream(e)))?;
        Ok((client, upstream, resume))
    }

    /// A parked relay, running again on its sockets; `parks`: it may be parked again
    /// (not when its park refused it or is gone, which would park and resume it in a loop).
    pub(crate) fn resume(client: TcpStream, upstream: TcpStream, r: Resume, parks: bool) -> Self {
        // `opts` of a tunnel the kernel took say never to splice (see `enter_kernel`).
        let mut relay = run(client, upstream, b"", b"", r.opts).closing();
        relay.parks = parks;
        relay.extras = r.extras;
        relay.up.moved = r.moved.0;
        relay.down.moved = r.moved.1;
        relay.up.done = r.done.0;
        relay.down.done = r.done.1;
        relay.last = r.last;
        relay
    }
}

impl<C, U> Future for Relay<C, U>
where
    C: End + Unpin,
    U: End + Unpin,
{
    type Output = (Totals, Result<(), Error>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut ended = ready!(this.poll_ended(cx));
        // Only a tunnel task's relay goes to the kernel; this one has nothing to look at.
        while let Ended::Reload = ended {
            ended = ready!(this.poll_ended(cx));
        }
        match ended {
            Ended::Done(totals, result) => Poll::Ready((totals, result)),
            // Only a parking relay says Idle, and that one is polled with `poll_ended`.
            Ended::Idle | Ended::Reload => {
                debug_assert!(false, "a parking relay awaited as a plain future");
                Poll::Pending
            }
        }
    }
}

impl<C, U> Relay<C, U>
where
    C: End + Unpin,
    U: End + Unpin,
{
    /// Relays until the relay ends, or (when `parking`) until it has been idle for
    /// `PARK_AFTER` with nothing held.
    pub(crate) fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<Ended> {
        let this = self;
        let moving = match this.leaving_done(cx) {
            Ok(moving) => moving,
            Err(e) => return this.finish(Err(e)),
        };
        if let Some(k) = this.extras.as_deref_mut().and_then(|e| e.kernel.as_mut()) {
            if k.state == State::Kernel && k.reloads != kernel::reloads() {
                k.reloads = kernel::reloads();
                return Poll::Ready(Ended::Reload);
            }
        }
        let mut last = this.last;
        let (client, upstream) = (&mut this.client, &mut this.upstream);
        let (up, down, opts) = (&mut this.up, &mut this.down, &this.opts);
        let (throttle, user, kernel, mut left) = match this.extras.as_deref_mut() {
            Some(Extras { throttle, user, kernel }) => {
                let (fwd, left) = match kernel.as_mut() {
                    Some(k) if k.state == State::Kernel => (Some(k), None),
                    other => (None, other),
                };
                (throttle.as_ref(), user.as_deref(), fwd, left)
            }
            None => (None, None, None, None),
        };
        let closes = this.closes;
        let failed = POOLS.with(|pools| {
            if !moving {
                return None;
            }
            if let Some(fwd) = kernel {
                if !up.done {
                    let last_out = closes && down.done;
                    let r =
                        up.poll_kernel(cx, pools, client, upstream, fwd, &mut last, last_out, user);
                    if let Poll::Ready(Err(e)) = r {
                        return Some(e);
                    }
                }
                if !down.done {
                    let last_out = closes && up.done;
                    let r = down
                        .poll_kernel(cx, pools, upstream, client, fwd, &mut last, last_out, user);
                    if let Poll::Ready(Err(e)) = r {
                        return Some(e);
                    }
                }
                return None;
            }
            if !up.done {
                let limit = throttle.map(|t| &t.up);
                let last_out = closes && down.done;
                let r = up.poll_move(
                    cx,
                    pools,
                    client,
                    upstream,
                    opts,
                    limit,
                    &mut last,
                    last_out,
                    user,
                    left.as_deref_mut(),
                );
                if let Poll::Ready(Err(e)) = r {
                    return Some(e);
                }
            }
            if !down.done {
                let limit = throttle.map(|t| &t.down);
                let last_out = closes && up.done;
                let r = down.poll_move(
                    cx, pools, upstream, client, opts, limit, &mut last, last_out, user, left,
                );
                if let Poll::Ready(Err(e)) = r {
                    return Some(e);
                }
            }
            None
        });
        if let Some(e) = failed {
            return this.finish(Err(e));
        }
        this.last = last;
        if this.up.done && this.down.done {
            let cut = cut_after_end(this.client.socket(), this.upstream.socket());
            return this.finish(cut.map_or(Ok(()), Err));
        }
        // A reset arriving while both directions wait elsewhere (the client already ended
        // its side, the upstream is quiet) would otherwise go unnoticed.
        if let Poll::Ready(e) = this.client.poll_gone(cx) {
            return this.finish(Err(Error::Client(e)));
        }
        let due = match this.to_kernel {
            ToKernel::No => false,
            ToKernel::Now => true,
            ToKernel::Busy => this.up.moved + this.down.moved >= kernel::ENTER_AFTER,
        };
        if due && this.quiescent() && !this.up.done && !this.down.done {
            this.to_kernel = ToKernel::No;
            this.enter_kernel(cx);
        }
        let park = (this.parks && this.quiescent()).then_some(PARK_AFTER);
        let mut verdict =
            deadline(&mut this.timer, this.last, this.opts.idle, this.parks, park, cx);
        if !matches!(verdict, Deadline::NotYet) {
            if let Some(e) = this.kernel_cut() {
                return this.finish(Err(e));
            }
            let forwarded = this.extras.as_deref().is_some_and(|e| e.kernel.is_some());
            if let Some(e) =
                kernel::failed(this.client.socket(), this.upstream.socket()).filter(|_| forwarded)
            {
                return this.finish(Err(e));
            }
        }
        if matches!(verdict, Deadline::Idle) && this.kernel_moved() {
            // Idle for the relay, not for the kernel: the clock starts again.
            this.last = Instant::now();
            this.timer = IdleTimer::Unarmed;
            verdict = deadline(&mut this.timer, this.last, this.opts.idle, this.parks, park, cx);
        }
        match verdict {
            Deadline::NotYet => Poll::Pending,
            Deadline::Idle => {
                // The relay ends the tunnel: each end still open is told so (a TLS end
                // gets its close_notify), as far as that goes without waiting.
                if !this.up.done {
                    this.upstream.abandon();
                }
                if !this.down.done {
                    this.client.abandon();
                }
                this.finish(Err(Error::Timeout(Phase::TunnelIdle)))
            }
            Deadline::Park => Poll::Ready(Ended::Idle),
        }
    }
}

impl<C: End, U: End> Relay<C, U> {
    fn finish(&mut self, result: Result<(), Error>) -> Poll<Ended> {
        if let Some(e) = &mut self.extras {
            e.account();
            // A socket closed with data unread is reset, which tells a peer blocked
            // writing to it that nobody reads: data the program passed up is not in the
            // socket's own queue, where the close would look, so it is said here.
            if let Some(k) = &e.kernel {
                for (i, s) in [(0, self.client.socket()), (1, self.upstream.socket())] {
                    if let Some(s) = s.filter(|_| k.unread(i) > 0) {
                        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
                    }
                }
            }
        }
        POOLS.with(|pools| {
            self.up.release(pools);
            self.down.release(pools);
        });
        Poll::Ready(Ended::Done(self.totals(), result))
    }

    /// Puts the tunnel under the kernel's program (`kernel`); the relay goes on as it was
    /// if the kernel does not take it.
    fn enter_kernel(&mut self, cx: &mut Context<'_>) {
        let (Some(c), Some(u)) = (self.client.socket(), self.upstream.socket()) else { return };
        let Some(f) = Forwarding::enter(c, u) else { return };
        POOLS.with(|pools| {
            self.up.release(pools);
            self.down.release(pools);
        });
        // Whatever the relay moves from now on is read through the socket map (data the
        // program passed up), which splice(2) does not see.
        self.opts.splice = SpliceMode::Never;
        self.up.splicing = false;
        self.down.splicing = false;
        self.extras.get_or_insert_with(Box::default).kernel = Some(f);
        POOLS.with(|p| p.switches.borrow().to_kernel.fetch_add(1, Ordering::Relaxed));
        // The directions wait in the kernel path from now on.
        cx.waker().wake_by_ref();
    }

    /// Whether the kernel forwards this tunnel and moved bytes since the last look (which
    /// also go to the user's counters).
    fn kernel_moved(&mut self) -> bool {
        let Some(e) = self.extras.as_deref_mut() else { return false };
        e.account();
        let moved = e.kernel.as_mut().is_some_and(|k| k.state == State::Kernel && k.moved_since());
        // Bytes for a side that failed are dropped by the kernel, not moved: its error
        // ends the tunnel (one getsockopt per side when the timer looks).
        moved && kernel::failed(self.client.socket(), self.upstream.socket()).is_none()
    }

    /// A tunnel leaving the kernel path (`Relay::leave`): true once each destination of a
    /// direction still open has sent what the program redirected to it, and the relay
    /// moves every byte (true at once for a relay the kernel does not forward); until
    /// then nothing is read, so no byte can overtake another, and a timer looks again
    /// after 1, 2, 4... up to 64 ms.
    fn leaving_done(&mut self, cx: &mut Context<'_>) -> Result<bool, Error> {
        let Some(k) = self.extras.as_deref_mut().and_then(|e| e.kernel.as_mut()) else {
            return Ok(true);
        };
        if k.state != State::Leaving {
            return Ok(true);
        }
        let (Some(c), Some(u)) = (self.client.socket(), self.upstream.socket()) else {
            return Ok(true);
        };
        loop {
            let up = self.up.done || k.drained(0, u).map_err(Error::Upstream)? == Drain::Done;
            let down = self.down.done || k.drained(1, c).map_err(Error::Client)? == Drain::Done;
            if up {
                k.set_clear(0);
            }
            if down {
                k.set_clear(1);
            }
            if k.settle() {
                self.up.pause = None;
                self.up.full = 0;
                return Ok(true);
            }
            let step = self.up.full.min(6);
            let sleep = self.up.pause.get_or_insert_with(|| {
                Box::pin(sleep_until(Instant::now() + kernel::DRAIN_POLL * (1 << step)))
            });
            if sleep.as_mut().poll(cx).is_pending() {
                return Ok(false);
            }
            self.up.pause = None;
            self.up.full = self.up.full.saturating_add(1);
        }
    }

    /// A tunnel the kernel forwards whose user's quota says to end it (the relay sees
    /// the kernel's bytes only when it looks).
    fn kernel_cut(&self) -> Option<Error> {
        let e = self.extras.as_deref()?;
        e.kernel.as_ref()?;
        e.user.as_deref().filter(|t| t.cut()).map(cut)
    }
}

/// A side that reset the connection after its end of stream (one getsockopt per side,
/// once per tunnel). A peer that dies (a parent or an origin whose process is killed, a
/// host that reboots) closes with an end of stream, like one that finished; only the
/// reset its stack sends when the other direction's bytes reach the dead socket tells
/// them apart, and nothing reads that socket any more to see it.
/// Only the ends that are sockets are looked at.
fn cut_after_end(client: Option<&TcpStream>, upstream: Option<&TcpStream>) -> Option<Error> {
    let cut = |s: Option<&TcpStream>| s.and_then(reset_after_end);
    cut(upstream).map(Error::Upstream).or_else(|| cut(client).map(Error::Client))
}

/// The reset a socket got after both directions ended, if it got one (its pending
/// error, which nothing read).
fn reset_after_end(s: &TcpStream) -> Option<io::Error> {
    s.take_error().ok().flatten().map(|e| {
        let why = format!("connection reset after its end of stream ({e})");
        io::Error::new(io::ErrorKind::ConnectionReset, why)
    })
}

/// A relay's one idle timer, moved only when it fires. On a worker it is a coarse
/// deadline in the worker's registry (no allocation); elsewhere a tokio timer.
pub(crate) enum IdleTimer {
    /// Armed at the first poll, which has the waker.
    Unarmed,
    Coarse(crate::io::idle::Coarse),
    Tokio(Pin<Box<Sleep>>),
}

/// What a relay's timer says.
enum Deadline {
    NotYet,
    /// `idle` has passed since the last byte.
    Idle,
    /// `park_after` has passed since the last byte (and the relay can be parked).
    Park,
}

/// Checks the relay's one timer. `parks`: the relay may be parked, so the timer first
/// fires `PARK_AFTER` after the last byte; `park`: it can be parked now.
fn deadline(
    timer: &mut IdleTimer,
    last: Instant,
    idle: Duration,
    parks: bool,
    park: Option<Duration>,
    cx: &mut Context<'_>,
) -> Deadline {
    // Settings are at most a year (config), but a relay built elsewhere may pass more.
    let idle = idle.min(crate::config::MAX_DURATION);
    // From a quiet time, how long until the timer should look again.
    let next = |quiet: Duration| {
        let to_idle = idle.saturating_sub(quiet);
        match parks {
            // Before PARK_AFTER: at PARK_AFTER. After it (something was held then): again
            // PARK_AFTER later.
            true if quiet < PARK_AFTER => (PARK_AFTER - quiet).min(to_idle),
            true => PARK_AFTER.min(to_idle),
            false => to_idle,
        }
    };
    if let IdleTimer::Unarmed = timer {
        let deadline = last + next(Duration::ZERO);
        *timer = match crate::io::idle::Coarse::arm(deadline, cx.waker()) {
            Some(c) => IdleTimer::Coarse(c),
            None => IdleTimer::Tokio(Box::pin(sleep_until(deadline))),
        };
    }
    let verdict = |quiet: Duration| {
        if quiet >= idle {
            Some(Deadline::Idle)
        } else if park.is_some_and(|after| quiet >= after) {
            Some(Deadline::Park)
        } else {
            None
        }
    };
    match timer {
        IdleTimer::Unarmed => Deadline::NotYet,
        IdleTimer::Coarse(c) => {
            if !c.fired(cx.waker()) {
                return Deadline::NotYet;
            }
            let quiet = last.elapsed();
            if let Some(d) = verdict(quiet) {
                return d;
            }
            c.rearm(Instant::now() + next(quiet), cx.waker());
            Deadline::NotYet
        }
        IdleTimer::Tokio(sleep) => {
            while sleep.as_mut().poll(cx).is_ready() {
                let quiet = last.elapsed();
                if let Some(d) = verdict(quiet) {
                    return d;
                }
                sleep.as_mut().reset(Instant::now() + next(quiet));
            }
            Deadline::NotYet
        }
    }
}

/// Which socket failed in `splice_body`, or stalled past the timeout.
#[derive(Debug)]
pub(crate) enum SpliceFailure {
    Src(io::Error),
    Dst(io::Error),
    /// Nothing came from the source.
    SrcStalled,
    /// The destination did not take what was read (the side that stalled is the one a
    /// timeout blames).
    DstStalled,
}

/// Splices up to `max` bytes of an HTTP body from `src` to `dst`, once, within `idle`.
/// `Ok(None)`: no pipe could be had, so copy instead; `Ok(Some(0))`: the source ended.
pub(crate) async fn splice_body(
    src: &TcpStream,
    dst: &TcpStream,
    max: u64,
    idle: Duration,
) -> Result<Option<usize>, SpliceFailure> {
    let Some(mut pipe) = POOLS.with(Pools::take_pipe) else { return Ok(None) };
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let round = splice_once(&mut pipe, src, dst, Side::Client, Side::Upstream, max);
    let result = tokio::time::timeout(idle, round).await;
    // Bytes still in the pipe were read and not taken: the destination stalled.
    let stalled =
        if pipe.is_empty() { SpliceFailure::SrcStalled } else { SpliceFailure::DstStalled };
    POOLS.with(|pools| pools.give_pipe(pipe));
    let Ok(result) = result else { return Err(stalled) };
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
            // Short is not empty (see `Dir::poll_move`): readiness stays until a splice
            // would block.
            Ok(n) => break n,
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

mod end;
pub(crate) mod kernel;

#[cfg(test)]
mod tests;
