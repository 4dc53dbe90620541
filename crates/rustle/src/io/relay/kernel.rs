//! Tunnels forwarded inside the kernel. Once a relay between two plain sockets has nothing
//! of its own to do per byte (no bandwidth limit), both sockets go into a sockhash whose
//! stream verdict program sends what arrives on one out of the other (`sys::bpf`): no
//! wakeup, no read and no write in the proxy per exchange. The relay keeps watching the
//! sockets for what the kernel does not forward: an end of stream (passed on with a
//! shutdown once the peer has sent everything the program gave it), a reset, and data the
//! program passed up (it does while the proxy still holds earlier bytes, and after the
//! tunnel leaves the kernel path).
//!
//! Counting: the program adds each piece of data to its socket's slot; the relay's totals
//! are what it moved itself plus those, read when the tunnel ends, when the idle timeout
//! looks, and when the park's sweep adds a user's traffic.
//!
//! Order: data the program passed up is written by the relay only once the destination
//! has sent everything redirected before it (`drained`: the bytes written into its TCP
//! stream, from TCP_INFO, against the program's count), and the program redirects again
//! only once the relay has written all it took (the gate). The end of stream is passed on
//! under the same condition, so nothing is cut short.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::net::TcpStream;

use crate::config::KernelForwarding;
use crate::io::sys::bpf::{self, Cells, Maps};

/// The maps and the program, made on first use (at start, or at the reload that first
/// asks for them); the error says why the kernel cannot forward.
static MAPS: OnceLock<Result<Maps, String>> = OnceLock::new();

/// Slots free to use, oldest freed first: a slot is reused as late as possible, long after
/// any program run that still held it has ended.
static FREE: Mutex<Slots> = Mutex::new(Slots { next: 0, free: VecDeque::new() });

struct Slots {
    /// Slots below this have been handed out at least once.
    next: u32,
    free: VecDeque<u32>,
}

/// Tunnels that entered the kernel path, left it (a reload gave them a bandwidth limit),
/// or could not enter (no slot, or the kernel refused a socket).
pub(crate) static ENTERED: AtomicU64 = AtomicU64::new(0);
pub(crate) static LEFT: AtomicU64 = AtomicU64::new(0);
pub(crate) static REFUSED: AtomicU64 = AtomicU64::new(0);

/// How often a relay looks again whether a destination has sent what the program
/// redirected to it (usually it has at the first look).
pub(crate) const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Bytes a tunnel moves through the relay before `auto` hands it to the kernel: a short
/// or idle tunnel stays in the relay, where the kernel path's setup (a dozen system calls,
/// and a socket-map record of a few hundred bytes of kernel memory per socket) would cost
/// more than it saves. `require` hands every tunnel over at once.
pub(crate) const ENTER_AFTER: u64 = 32 * 1024;

/// What the program may queue on a destination beyond what the relay last saw sent: the
/// kernel's own queue has no bound (a slow receiver would let a fast sender fill memory);
/// past it, data is passed up and held in the source's receive buffer, whose window then
/// holds the sender back, until the relay has seen the queue drain.
pub(crate) const WINDOW: u64 = 1 << 20;

/// Most sockets the maps hold (two per tunnel); past that, tunnels stay in the relay.
const MAX_SOCKETS: u32 = 1 << 18;

/// Whether the kernel can forward for `mode`, making the maps on the first call that wants
/// them (at start, or at the first reload that asks): `Err` only for `require` where it
/// cannot. Nothing changes for tunnels until `set`.
pub(crate) fn prepare(mode: KernelForwarding) -> Result<(), String> {
    if mode == KernelForwarding::Off {
        return Ok(());
    }
    let maps = MAPS.get_or_init(|| Maps::new(capacity()).map_err(|e| e.to_string()));
    match (maps, mode) {
        (Err(e), KernelForwarding::Require) => Err(format!(
            "[relay] kernel_forwarding = \"require\", but the kernel cannot forward tunnels \
             here: {e} (it needs sockmap with stream verdict programs, Linux 5.10 or later, \
             and CAP_BPF with CAP_NET_ADMIN, or root)"
        )),
        _ => Ok(()),
    }
}

/// Says once, at start, whether the kernel forwards (after `prepare`).
pub(crate) fn announce(mode: KernelForwarding) {
    match MAPS.get() {
        _ if mode == KernelForwarding::Off => {
            tracing::info!("kernel forwarding: off ([relay] kernel_forwarding = \"off\")")
        }
        Some(Ok(m)) => tracing::info!(
            "kernel forwarding: on (plain tunnels go through a sockhash, room for {} sockets)",
            m.capacity()
        ),
        Some(Err(e)) => {
            tracing::info!("kernel forwarding: not available here ({e}); tunnels use the relay")
        }
        None => {}
    }
}

thread_local! {
    /// Policies put in force on this worker thread since it started (`reloaded`):
    /// forwarded tunnels compare it with what they last saw, to look at their limits again.
    static RELOADS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A new policy is in force on this worker thread (a reload, a users API change).
pub(crate) fn reloaded() {
    RELOADS.with(|r| r.set(r.get() + 1));
}

/// Policies put in force on this thread so far.
pub(crate) fn reloads() -> u64 {
    RELOADS.with(std::cell::Cell::get)
}

/// The error of a forwarded tunnel's side that failed (a reset, or the kernel could not
/// send on it), if one did: the kernel drops what it would have sent there, where the
/// relay would have seen the write fail.
pub(crate) fn failed<S: AsFd>(
    client: Option<&S>,
    upstream: Option<&S>,
) -> Option<crate::error::Error> {
    let err = |s: Option<&S>| s.and_then(|s| socket2::SockRef::from(s).take_error().ok().flatten());
    err(upstream)
        .map(crate::error::Error::Upstream)
        .or_else(|| err(client).map(crate::error::Error::Client))
}

/// Whether the maps were made (the kernel can forward here).
pub(crate) fn available() -> bool {
    matches!(MAPS.get(), Some(Ok(_)))
}

/// Whether tunnels under `mode` go to the kernel: not off, and the maps were made.
pub(crate) fn enabled(mode: KernelForwarding) -> bool {
    mode != KernelForwarding::Off && available()
}

/// Sockets the maps are made for: the open-file limit bounds the sockets the process can
/// have at once.
fn capacity() -> u32 {
    let limit = rlimit::Resource::NOFILE.get().map_or(u64::from(MAX_SOCKETS), |(_, hard)| hard);
    u32::try_from(limit).unwrap_or(MAX_SOCKETS).clamp(1024, MAX_SOCKETS)
}

fn take_slot(maps: &Maps) -> Option<u32> {
    let mut s = FREE.lock().unwrap_or_else(PoisonError::into_inner);
    // Reuse only once enough slots wait (a late program run never meets a new tunnel).
    if s.free.len() > 64 || s.next >= maps.capacity() {
        return s.free.pop_front();
    }
    s.next += 1;
    Some(s.next - 1)
}

fn give_slot(slot: u32) {
    FREE.lock().unwrap_or_else(PoisonError::into_inner).free.push_back(slot);
}

/// Whether a destination has sent what the program redirected to it (`drained`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drain {
    Done,
    /// Not yet, but it sent more since the last look.
    Moving,
    /// Nothing more sent since the last look.
    Waiting,
}

/// Where a forwarded tunnel is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// The program redirects.
    Kernel,
    /// Leaving: the program passes everything up; the relay waits until each destination
    /// has sent what was redirected before taking over.
    Leaving,
    /// The relay moves every byte (the sockets stay in the map, passed up, until closed).
    Left,
}

/// One forwarded tunnel: its two sockets' slots (0: the client's, 1: the upstream's).
pub(crate) struct Forwarding {
    maps: &'static Maps,
    slot: [u32; 2],
    cookie: [u64; 2],
    /// Bytes written into each socket's stream other than by the program: before the
    /// kernel took over, then by the relay.
    written: [u64; 2],
    /// Bytes the relay has read from each socket since (what the gate opens at).
    taken: [u64; 2],
    /// Whether each socket's destination has sent everything the program redirected to
    /// it, with no redirect possible since (the gate closed): the relay may write there.
    clear: [bool; 2],
    /// What the destination of each socket's data had sent of the program's at the last
    /// look (`drained`).
    sent: [u64; 2],
    /// Redirected bytes already added to the user's counters, each direction.
    accounted: [u64; 2],
    /// Redirected bytes when activity was last looked at.
    seen: u64,
    pub(crate) state: State,
    /// The worker's reload count when the tunnel's limits were last looked at.
    pub(crate) reloads: u64,
}

impl Forwarding {
    /// Puts a quiescent tunnel's sockets under the program. None (the relay goes on) when
    /// the kernel path is off, full, or refuses a socket.
    pub(crate) fn enter(client: &TcpStream, upstream: &TcpStream) -> Option<Forwarding> {
        let Some(Ok(maps)) = MAPS.get() else { return None };
        let Some(first) = take_slot(maps) else {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let Some(second) = take_slot(maps) else {
            give_slot(first);
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let mut f = Forwarding {
            maps,
            slot: [first, second],
            cookie: [0; 2],
            written: [0; 2],
            taken: [0; 2],
            clear: [true; 2],
            sent: [0; 2],
            accounted: [0; 2],
            seen: 0,
            state: State::Kernel,
            // Looked at once after entry: a reload may have come since the tunnel's
            // limits were taken.
            reloads: u64::MAX,
        };
        match f.insert([client, upstream]) {
            Ok(()) => {
                ENTERED.fetch_add(1, Ordering::Relaxed);
                Some(f)
            }
            Err((e, inserted)) => {
                tracing::debug!("tunnel not forwarded in the kernel: {e}");
                REFUSED.fetch_add(1, Ordering::Relaxed);
                if !inserted {
                    // Nothing went under the program: Drop frees the slots.
                    return None;
                }
                // A socket in the map must stay there (taking it out drops what its
                // queues hold): the relay takes over, as after a reload.
                f.leave();
                Some(f)
            }
        }
    }

    /// On failure, whether a socket went into the map.
    fn insert(&mut self, sockets: [&TcpStream; 2]) -> Result<(), (io::Error, bool)> {
        let before = |e| (e, false);
        for (i, s) in sockets.iter().enumerate() {
            // A socket map takes established sockets only (one whose peer has sent its
            // FIN is not).
            if !bpf::tcp_established(s.as_fd()).map_err(before)? {
                return Err(before(io::Error::other("a socket is no longer established")));
            }
            self.cookie[i] = bpf::socket_cookie(s.as_fd()).map_err(before)?;
            self.written[i] = bpf::tcp_written(s.as_fd()).map_err(before)?;
        }
        for i in 0..2 {
            let c = self.cells(i);
            c.owner.store(self.cookie[i], Ordering::Relaxed);
            c.peer.store(self.cookie[1 - i], Ordering::Relaxed);
            c.gate.store(0, Ordering::Relaxed);
            c.passed.store(0, Ordering::Relaxed);
            c.limit.store(WINDOW, Ordering::Relaxed);
            c.redirected.store(0, Ordering::Release);
        }
        for (i, s) in sockets.iter().enumerate() {
            self.maps.insert(self.cookie[i], self.slot[i], s.as_fd()).map_err(|e| (e, i > 0))?;
        }
        // Data that arrived before the sockets were in the map waits in their receive
        // queues until the next arrival: lowering the mark (to what it is) runs the
        // program over it now.
        for s in sockets {
            crate::io::sys::set_rcvlowat(s, 1).map_err(|e| (e, true))?;
        }
        Ok(())
    }

    fn cells(&self, i: usize) -> &Cells {
        self.maps.cells(self.slot[i])
    }

    /// Bytes the program redirected from socket `i` to its peer.
    pub(crate) fn redirected(&self, i: usize) -> u64 {
        self.cells(i).redirected.load(Ordering::Acquire)
    }

    /// Bytes the program passed up from socket `i` that the relay has not read yet.
    pub(crate) fn unread(&self, i: usize) -> u64 {
        self.cells(i).passed.load(Ordering::Acquire).saturating_sub(self.taken[i])
    }

    /// The relay read `n` bytes from socket `i` (passed up by the program).
    pub(crate) fn took(&mut self, i: usize, n: usize) {
        self.taken[i] += n as u64;
    }

    /// The relay wrote `n` bytes into socket `j`.
    pub(crate) fn wrote(&mut self, j: usize, n: usize) {
        self.written[j] += n as u64;
    }

    /// Whether the relay may write what it read from socket `i` into its peer `dst` (or
    /// pass its end of stream on): the peer has sent everything the program redirected
    /// from `i`.
    pub(crate) fn drained(&mut self, i: usize, dst: &TcpStream) -> io::Result<Drain> {
        if self.clear[i] {
            return Ok(Drain::Done);
        }
        let by_program = bpf::tcp_written(dst.as_fd())?.wrapping_sub(self.written[1 - i]);
        let redirected = self.redirected(i);
        if by_program >= redirected {
            self.clear[i] = true;
            return Ok(Drain::Done);
        }
        let moved = by_program != self.sent[i];
        self.sent[i] = by_program;
        if !moved {
            // A destination that failed takes nothing more: its error is the tunnel's.
            if let Some(e) = dst.take_error()? {
                return Err(e);
            }
            bpf::kick_writer(dst.as_fd())?;
        }
        Ok(if moved { Drain::Moving } else { Drain::Waiting })
    }

    /// Socket `i` has data passed up: the next write to its peer waits for `drained`.
    pub(crate) fn hold(&mut self, i: usize) {
        if self.state == State::Kernel {
            self.clear[i] = false;
        }
    }

    /// Everything read from socket `i` was written to its peer: the program may redirect
    /// again (in the kernel state).
    pub(crate) fn open_gate(&mut self, i: usize) {
        if self.state == State::Kernel {
            // Drained just before: the program may queue a window again.
            let c = self.cells(i);
            c.limit.store(self.redirected(i) + WINDOW, Ordering::Relaxed);
            c.gate.store(self.taken[i], Ordering::Release);
        }
    }

    /// The tunnel leaves the kernel path: the program passes everything up from now on.
    pub(crate) fn leave(&mut self) {
        if self.state != State::Kernel {
            return;
        }
        for i in 0..2 {
            self.cells(i).gate.store(u64::MAX, Ordering::Release);
            self.clear[i] = false;
        }
        self.state = State::Leaving;
        LEFT.fetch_add(1, Ordering::Relaxed);
    }

    /// Socket `i`'s destination needs no more waiting (its direction ended).
    pub(crate) fn set_clear(&mut self, i: usize) {
        self.clear[i] = true;
    }

    /// In the leaving state, whether both destinations have been found drained (the
    /// relay then moves every byte).
    pub(crate) fn settle(&mut self) -> bool {
        if self.state == State::Leaving && self.clear == [true; 2] {
            self.state = State::Left;
        }
        self.state == State::Left
    }

    /// Whether the program moved bytes since the last look.
    pub(crate) fn moved_since(&mut self) -> bool {
        let now = self.redirected(0).wrapping_add(self.redirected(1));
        let moved = now != self.seen;
        self.seen = now;
        moved
    }

    /// Redirected bytes not yet added to the user's counters, (up, down); counted as
    /// added.
    pub(crate) fn unaccounted(&mut self) -> (u64, u64) {
        let now = [self.redirected(0), self.redirected(1)];
        let delta = (now[0] - self.accounted[0], now[1] - self.accounted[1]);
        self.accounted = now;
        delta
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for i in 0..2 {
            if self.cookie[i] != 0 {
                self.maps.forget(self.cookie[i]);
            }
            give_slot(self.slot[i]);
        }
    }
}
