//! Idle tunnels, parked. A plain-TCP tunnel that has moved no byte for
//! `relay::PARK_AFTER` leaves the event loop: its task ends, its two sockets leave
//! tokio's registrations for the worker's park (an epoll set of its own, which one task
//! watches), and what the relay must remember (bytes moved, limits, which directions
//! have ended, the log record, the connection slot) goes into a slot of a flat table.
//! The first byte, end of stream or error on the source of a direction still open
//! brings it back as a new task running the same relay. A parked tunnel costs its slot,
//! about 350 bytes, where a running one keeps a task (640 bytes) and two readiness
//! records (256 bytes each).
//!
//! Each worker has its own park (a thread-local), so nothing here is shared or locked.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use mio::unix::SourceFd;
use mio::{Events, Interest, Token};

use super::{Label, PackedLabel, Record};
use crate::error::{Error, Phase};
use crate::front::worker::ConnGuard;
use crate::io::relay::{Relay, Resume};

/// A parked tunnel.
struct Parked {
    guard: ConnGuard,
    client: std::net::TcpStream,
    upstream: std::net::TcpStream,
    resume: Resume,
    rec: Record,
    /// The record's label while parked (most fit inline).
    label: Option<PackedLabel>,
}

impl Parked {
    /// Puts the record's label back.
    fn unpack_label(&mut self) {
        if let Some(p) = self.label.take() {
            self.rec.label = Label::unpack(&p);
        }
    }
}

/// A worker's park.
struct Park {
    /// Registers sockets with the park's epoll set (a duplicate of the descriptor the
    /// watching task polls).
    registry: mio::Registry,
    /// Parked tunnels by token; a flat table so that parked tunnels sit together in
    /// memory rather than scattered between freed tasks.
    slots: Vec<Option<Parked>>,
    free: Vec<usize>,
    /// Tunnels parked since the last sweep (the sweep then returns freed memory).
    since_sweep: usize,
}

impl Park {
    /// Takes a tunnel out (its sockets leave the park's epoll set).
    fn remove(&mut self, slot: usize) -> Option<Parked> {
        let p = self.slots.get_mut(slot)?.take()?;
        deregister(&self.registry, &p);
        self.free.push(slot);
        PARKED.fetch_sub(1, Ordering::Relaxed);
        Some(p)
    }

    /// Takes every tunnel out.
    fn remove_all(&mut self) -> Vec<Parked> {
        self.free.clear();
        let all: Vec<Parked> = self.slots.drain(..).flatten().collect();
        for p in &all {
            deregister(&self.registry, p);
        }
        PARKED.fetch_sub(all.len(), Ordering::Relaxed);
        all
    }
}

thread_local! {
    static PARK: RefCell<Option<Park>> = const { RefCell::new(None) };
}

/// Tunnels parked now, across workers (diagnostics and tests; changes only when a
/// tunnel is parked or resumed).
static PARKED: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread parks idle tunnels (a worker does once `serve_here` runs).
pub(crate) fn here() -> bool {
    PARK.with(|p| p.borrow().is_some())
}

/// Tunnels parked now, in the whole process. A hook for the integration tests
/// (`tests/park.rs`), which see only the public API; hidden from the docs.
#[doc(hidden)]
pub fn parked_now() -> usize {
    PARKED.load(Ordering::Relaxed)
}

/// Opens this thread's park and watches it: resumes tunnels whose sockets have something
/// to say. Runs for as long as the worker does.
pub(crate) async fn serve_here() {
    let (poll, registry) = match mio::Poll::new().and_then(|p| {
        let r = p.registry().try_clone()?;
        Ok((p, r))
    }) {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!("cannot open a park for idle tunnels ({e}); they stay on the loop");
            return;
        }
    };
    let mut fd = match crate::io::sys::watch_poll(poll) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("cannot watch the park for idle tunnels ({e}); they stay on the loop");
            return;
        }
    };
    PARK.with(|p| {
        *p.borrow_mut() =
            Some(Park { registry, slots: Vec::new(), free: Vec::new(), since_sweep: 0 })
    });
    let mut events = Events::with_capacity(256);
    'watch: loop {
        let mut ready = match fd.readable_mut().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("the park for idle tunnels failed ({e})");
                break;
            }
        };
        // Cleared before looking: an event that comes after the last look wakes this
        // task again.
        ready.clear_ready();
        loop {
            match ready.get_inner_mut().poll(&mut events, Some(Duration::ZERO)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("the park for idle tunnels failed ({e})");
                    break 'watch;
                }
            }
            if events.is_empty() {
                break;
            }
            for ev in events.iter() {
                // Both sockets of one tunnel may be in the same batch: the second finds
                // its slot empty.
                if let Some(p) = take(ev.token().0) {
                    resume(p, true);
                }
            }
        }
    }
    // The park failed: nothing would wake what it holds, so every tunnel goes back on the
    // event loop and none is parked again.
    let all = PARK.with(|cell| cell.borrow_mut().take().map(|mut park| park.remove_all()));
    for p in all.into_iter().flatten() {
        resume(p, false);
    }
}

/// Parks an idle tunnel's relay (see `Relay::poll_ended`). On a thread without a park,
/// or if the sockets cannot be moved, the tunnel goes on as a task.
pub(crate) fn park(
    guard: ConnGuard,
    relay: Relay<tokio::net::TcpStream, tokio::net::TcpStream>,
    rec: Record,
) {
    let (client, upstream, state) = match relay.park() {
        Ok(parts) => parts,
        Err((totals, e)) => {
            super::finish(&guard, &rec, totals, Err(e));
            return;
        }
    };
    let mut rec = rec;
    let label = rec.label.pack();
    let p = Parked { guard, client, upstream, resume: state, rec, label };
    let refused = PARK.with(|cell| {
        let mut park = cell.borrow_mut();
        let Some(park) = park.as_mut() else { return Some(p) };
        let slot = park.free.pop().unwrap_or_else(|| {
            park.slots.push(None);
            park.slots.len() - 1
        });
        let token = Token(slot);
        // Only the sources of directions still open are watched: a client that has
        // sent its FIN stays readable (at end of stream) and would wake the tunnel at
        // once; its errors show on the next write.
        let (up_done, down_done) = p.resume.done();
        let sources = [(!up_done).then_some(&p.client), (!down_done).then_some(&p.upstream)];
        let registered =
            sources.into_iter().flatten().try_for_each(|s| register(&park.registry, s, token));
        match registered {
            Ok(()) => {
                park.slots[slot] = Some(p);
                park.since_sweep += 1;
                PARKED.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(e) => {
                tracing::debug!("{}: tunnel not parked: {e}", p.rec.peer);
                deregister(&park.registry, &p);
                park.free.push(slot);
                Some(p)
            }
        }
    });
    if let Some(p) = refused {
        resume(p, false);
    }
}

fn register(registry: &mio::Registry, s: &std::net::TcpStream, token: Token) -> io::Result<()> {
    registry.register(&mut SourceFd(&s.as_raw_fd()), token, Interest::READABLE)
}

fn deregister(registry: &mio::Registry, p: &Parked) {
    // A socket that was not registered (an ended direction's source, or a failed parking)
    // answers ENOENT: nothing to undo.
    let _ = registry.deregister(&mut SourceFd(&p.client.as_raw_fd()));
    let _ = registry.deregister(&mut SourceFd(&p.upstream.as_raw_fd()));
}

/// Takes a tunnel out of the park (its sockets leave the park's epoll set).
fn take(slot: usize) -> Option<Parked> {
    PARK.with(|cell| cell.borrow_mut().as_mut()?.remove(slot))
}

/// Ends a parked tunnel with its log line.
fn end(mut p: Parked, error: Error) {
    p.unpack_label();
    super::finish(&p.guard, &p.rec, p.resume.totals(), Err(error));
}

/// Runs a tunnel again: its sockets back on the event loop, its relay in a new task
/// (`parks`: that may be parked again).
fn resume(mut p: Parked, parks: bool) {
    p.unpack_label();
    let Parked { guard, client, upstream, resume, rec, .. } = p;
    let totals = resume.totals();
    let client = match tokio::net::TcpStream::from_std(client) {
        Ok(s) => s,
        Err(e) => return super::finish(&guard, &rec, totals, Err(Error::Client(e))),
    };
    let upstream = match tokio::net::TcpStream::from_std(upstream) {
        Ok(s) => s,
        Err(e) => return super::finish(&guard, &rec, totals, Err(Error::Upstream(e))),
    };
    let relay = Relay::resume(client, upstream, resume, parks);
    tokio::task::spawn_local(super::socket_task(guard, relay, rec));
}

/// Ends parked tunnels whose idle timeout has passed (each writes its log line). Returns
/// how many tunnels were parked since the last sweep, so that the caller can hand the
/// memory their tasks used back to the kernel.
pub(crate) fn sweep(now: impl Into<Instant>) -> usize {
    let now = now.into();
    let mut leaving = Vec::new();
    let (expired, parked_since) = PARK.with(|cell| {
        let mut park = cell.borrow_mut();
        let Some(park) = park.as_mut() else { return (Vec::new(), 0) };
        let leaving = &mut leaving;
        let mut expired = Vec::new();
        for slot in 0..park.slots.len() {
            let Some(p) = park.slots[slot].as_mut() else { continue };
            match kernel_tick(p, now) {
                Tick::Stay => {}
                Tick::Leave => {
                    // Back on the loop, where the relay takes over from the kernel.
                    leaving.extend(park.remove(slot));
                    continue;
                }
                Tick::Failed(e) => {
                    expired.extend(park.remove(slot).map(|p| (p, e)));
                    continue;
                }
            }
            if p.resume.deadline() <= now {
                expired.extend(park.remove(slot).map(|p| (p, Error::Timeout(Phase::TunnelIdle))));
            } else if let Some(e) = p.resume.cut() {
                // Its user's quota ends open tunnels.
                expired.extend(park.remove(slot).map(|p| (p, e)));
            }
        }
        // Give back the table's tail once it is free (all of it when nothing is parked).
        while park.slots.last().is_some_and(Option::is_none) {
            park.slots.pop();
        }
        let len = park.slots.len();
        park.free.retain(|&slot| slot < len);
        if park.slots.capacity() > 2 * len.max(64) {
            park.slots.shrink_to(len);
            park.free.shrink_to_fit();
        }
        (expired, std::mem::take(&mut park.since_sweep))
    });
    for (p, e) in expired {
        end(p, e);
    }
    for p in leaving {
        resume(p, true);
    }
    parked_since
}

/// A tunnel the kernel forwards, as the sweep sees it: its idle clock and its user's
/// counters follow what the kernel moved, and after a reload a tunnel that now has a
/// bandwidth limit leaves the kernel path.
fn kernel_tick(p: &mut Parked, now: Instant) -> Tick {
    let Some((seen, moved)) = p.resume.forwarded(now) else { return Tick::Stay };
    if let Some(throttle) = limits_after_reload(&p.guard, &p.rec, seen) {
        p.resume.leave(&throttle);
        return Tick::Leave;
    }
    // A side that failed: the kernel drops what it moves there (looked at only while it
    // moves bytes, one getsockopt per side).
    if moved {
        if let Some(e) = crate::io::relay::kernel::failed(Some(&p.client), Some(&p.upstream)) {
            return Tick::Failed(e);
        }
    }
    Tick::Stay
}

/// What the sweep does with a parked tunnel the kernel forwards.
enum Tick {
    Stay,
    /// A reload gave it a bandwidth limit: resume it, to leave the kernel path.
    Leave,
    Failed(Error),
}

/// After a reload (the thread's count differs from `seen`, which is then updated), the
/// bandwidth limits a forwarded tunnel now has, if it has any.
fn limits_after_reload(
    guard: &ConnGuard,
    rec: &Record,
    seen: &mut u64,
) -> Option<crate::limits::Throttle> {
    let now = crate::io::relay::kernel::reloads();
    if *seen == now {
        return None;
    }
    *seen = now;
    limits_now(guard, rec)
}

/// The bandwidth limits a tunnel would get now, if it would get any.
pub(crate) fn limits_now(guard: &ConnGuard, rec: &Record) -> Option<crate::limits::Throttle> {
    let throttle = guard.worker().throttle_now(guard.listener(), rec.user.as_deref());
    (!throttle.is_unlimited()).then_some(throttle)
}

/// Closes every parked tunnel (the shutdown deadline has passed), each with its log line.
pub(crate) fn close_all() {
    let all = PARK.with(|cell| cell.borrow_mut().as_mut().map(Park::remove_all));
    for p in all.into_iter().flatten() {
        end(p, Error::ShutdownDeadline);
    }
}
