//! Waiting for a kept-alive client's next request without a timer or a shutdown watch per
//! wait. A connection between requests registers its waker here with a deadline; the
//! worker's housekeeping tick (every 100 ms) wakes the ones past their deadline, and wakes
//! them all half a second into a drain. Registering is a slot in a vector and a waker clone,
//! where a tokio timer plus a watch-channel waiter took two locks and a timer-wheel
//! insertion and removal per request. Deadlines start from the last sweep's time plus one
//! tick, not from a clock read, so that a kept-alive exchange reads no clock. The price is
//! precision: a keep-alive timeout ends up to two ticks late (never early), which nobody
//! can tell from a network delay. Deadlines are on tokio's clock, so a test that pauses
//! it moves them.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

/// How often the worker's housekeeping sweeps the waits.
pub(crate) const TICK: Duration = Duration::from_millis(100);

struct Entry {
    deadline: Instant,
    waker: Waker,
    /// Woken by a sweep: the wait is over.
    fired: bool,
    /// A wait between requests, which shutdown ends too (an exchange in flight is let
    /// finish).
    idle: bool,
}

/// A worker's waiting connections.
pub(crate) struct Waiters {
    slots: RefCell<Vec<Option<Entry>>>,
    free: RefCell<Vec<usize>>,
    /// The time of the last sweep: deadlines as coarse as the sweep start from it, as
    /// reading the clock costs more than the rest of registering a wait.
    swept: Cell<Instant>,
}

impl Default for Waiters {
    fn default() -> Self {
        Waiters {
            slots: RefCell::default(),
            free: RefCell::default(),
            swept: Cell::new(Instant::now()),
        }
    }
}

impl Waiters {
    /// Now, as of the last sweep (a tick ago at most, when a worker sweeps).
    pub(crate) fn coarse_now(&self) -> std::time::Instant {
        self.swept.get().into_std()
    }

    /// A deadline `after` from now without reading the clock: from the last sweep plus
    /// one tick, which is no earlier than now while sweeps keep their pace, so a wait
    /// never ends early; it ends up to two ticks late.
    pub(crate) fn deadline(&self, after: Duration) -> Instant {
        self.swept.get() + TICK + after
    }

    fn register(&self, deadline: Instant, idle: bool, waker: &Waker) -> usize {
        let entry = Entry { deadline, waker: waker.clone(), fired: false, idle };
        let mut slots = self.slots.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(i) => {
                slots[i] = Some(entry);
                i
            }
            None => {
                slots.push(Some(entry));
                slots.len() - 1
            }
        }
    }

    /// Whether the wait in slot `i` has fired; refreshes its waker otherwise.
    fn check(&self, i: usize, waker: &Waker) -> bool {
        let mut slots = self.slots.borrow_mut();
        match slots.get_mut(i).and_then(Option::as_mut) {
            Some(e) if e.fired => true,
            Some(e) => {
                if !e.waker.will_wake(waker) {
                    e.waker = waker.clone();
                }
                false
            }
            None => true,
        }
    }

    fn remove(&self, i: usize) {
        if let Some(slot) = self.slots.borrow_mut().get_mut(i) {
            *slot = None;
            self.free.borrow_mut().push(i);
        }
    }

    /// Moves the deadline of slot `i` (and clears its firing).
    fn rearm(&self, i: usize, deadline: Instant, waker: &Waker) {
        if let Some(e) = self.slots.borrow_mut().get_mut(i).and_then(Option::as_mut) {
            e.deadline = deadline;
            e.fired = false;
            if !e.waker.will_wake(waker) {
                e.waker = waker.clone();
            }
        }
    }

    /// Wakes the waits past their deadline (and with `stopping`, every wait between
    /// requests).
    /// `now` is tokio's clock (std's converts: they are the same clock unless a test
    /// paused tokio's).
    pub(crate) fn sweep(&self, now: impl Into<Instant>, stopping: bool) {
        let now = now.into();
        self.swept.set(now);
        let mut slots = self.slots.borrow_mut();
        for e in slots.iter_mut().flatten() {
            if !e.fired && ((stopping && e.idle) || e.deadline <= now) {
                e.fired = true;
                e.waker.wake_by_ref();
            }
        }
        // Give back memory after a burst of connections has gone.
        if slots.len() > 64 && self.free.borrow().len() == slots.len() {
            slots.clear();
            self.free.borrow_mut().clear();
        }
    }

    /// Runs `fut`, a wait between requests, until it completes (`Some`) or the wait
    /// fires (`None`): the deadline passed or the worker is stopping.
    pub(crate) fn wait<'a, F: Future + Unpin>(&'a self, fut: F, deadline: Instant) -> Wait<'a, F> {
        Wait { waiters: self, fut, deadline, idle: true, slot: None }
    }

    /// Runs `fut`, part of an exchange in flight, until it completes (`Some`) or the
    /// deadline passes (`None`); shutdown lets it go on. A coarse timeout (one tick late
    /// at most) for waits that are long and almost never reached, such as the I/O
    /// timeout while an origin prepares its answer.
    pub(crate) fn within<'a, F: Future + Unpin>(
        &'a self,
        fut: F,
        deadline: Instant,
    ) -> Wait<'a, F> {
        Wait { waiters: self, fut, deadline, idle: false, slot: None }
    }

    #[cfg(test)]
    fn registered(&self) -> usize {
        self.slots.borrow().iter().flatten().count()
    }
}

/// Polls `fut` once: `Some` when it completed at once (so no timer was needed).
pub(crate) async fn poll_once<F: Future>(mut fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(Some(r)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

thread_local! {
    /// The idle deadlines of this thread's relays (open tunnels), swept with the worker's
    /// other waits.
    static RELAYS: Waiters = Waiters::default();
    /// Whether this thread sweeps `RELAYS` (a worker does; a bare runtime in a test does
    /// not, and its relays use tokio timers).
    static SWEPT: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as one whose housekeeping calls `sweep_relays`.
pub(crate) fn sweep_relays_here() {
    SWEPT.with(|s| s.set(true));
}

/// Wakes the relays of this thread whose idle deadline has passed.
pub(crate) fn sweep_relays(now: impl Into<Instant>) {
    RELAYS.with(|w| w.sweep(now, false));
}

/// A coarse deadline for a relay's idle timeout: a slot in the thread's registry (a
/// deadline and a waker, about 40 bytes) where a tokio timer is a 112-byte allocation per
/// open tunnel. Fires up to one housekeeping tick (100 ms) late.
pub(crate) struct Coarse {
    slot: usize,
    /// A slot number means something only on the thread that made it: not Send.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Coarse {
    /// None when this thread does not sweep relays.
    pub(crate) fn arm(deadline: Instant, waker: &Waker) -> Option<Coarse> {
        if !SWEPT.with(Cell::get) {
            return None;
        }
        let slot = RELAYS.with(|w| w.register(deadline, false, waker));
        Some(Coarse { slot, _thread: std::marker::PhantomData })
    }

    /// Whether the deadline has passed (a sweep saw it); refreshes the waker otherwise.
    pub(crate) fn fired(&self, waker: &Waker) -> bool {
        RELAYS.with(|w| w.check(self.slot, waker))
    }

    pub(crate) fn rearm(&self, deadline: Instant, waker: &Waker) {
        RELAYS.with(|w| w.rearm(self.slot, deadline, waker));
    }
}

impl Drop for Coarse {
    fn drop(&mut self) {
        // A thread being torn down has dropped its registry already.
        let _ = RELAYS.try_with(|w| w.remove(self.slot));
    }
}

/// See `Waiters::wait`.
pub(crate) struct Wait<'a, F> {
    waiters: &'a Waiters,
    fut: F,
    deadline: Instant,
    idle: bool,
    slot: Option<usize>,
}

impl<F: Future + Unpin> Future for Wait<'_, F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(r) = Pin::new(&mut this.fut).poll(cx) {
            return Poll::Ready(Some(r));
        }
        match this.slot {
            None => this.slot = Some(this.waiters.register(this.deadline, this.idle, cx.waker())),
            Some(i) => {
                if this.waiters.check(i, cx.waker()) {
                    return Poll::Ready(None);
                }
            }
        }
        Poll::Pending
    }
}

impl<F> Wait<'_, F> {
    /// Gives the wait a new deadline (after it fired, or before); the next poll registers
    /// it again.
    pub(crate) fn rearm(&mut self, deadline: Instant) {
        self.deadline = deadline;
        if let Some(i) = self.slot.take() {
            self.waiters.remove(i);
        }
    }
}

impl<F> Drop for Wait<'_, F> {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            self.waiters.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls once: `Some` when ready.
    async fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| match Pin::new(&mut *f).poll(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    /// A deadline taken between sweeps is never before the time asked for: it counts
    /// from the last sweep plus a tick, and ends at the first sweep past that.
    #[tokio::test]
    async fn deadlines_between_sweeps_never_end_early() {
        let waiters = Waiters::default();
        let t0 = Instant::now();
        waiters.sweep(t0, false);
        let after = Duration::from_millis(300);
        let deadline = waiters.deadline(after);
        assert_eq!(deadline, t0 + TICK + after);
        let (_tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut wait = waiters.wait(rx, deadline);
        assert!(poll_once(&mut wait).await.is_none());
        // Registered as late as just before the next sweep, it still has its 300 ms.
        waiters.sweep(t0 + TICK + after - Duration::from_millis(1), false);
        assert!(poll_once(&mut wait).await.is_none());
        waiters.sweep(t0 + TICK + after, false);
        assert!(matches!(poll_once(&mut wait).await, Some(None)));
    }

    #[tokio::test]
    async fn a_wait_ends_with_its_future_or_with_a_sweep() {
        let waiters = Waiters::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut wait = waiters.wait(rx, Instant::now() + Duration::from_secs(60));
        assert!(poll_once(&mut wait).await.is_none());
        assert_eq!(waiters.registered(), 1);
        // A sweep before the deadline changes nothing.
        waiters.sweep(Instant::now(), false);
        assert!(poll_once(&mut wait).await.is_none());
        tx.send(7).expect("receiver alive");
        assert!(matches!(poll_once(&mut wait).await, Some(Some(Ok(7)))));
        drop(wait);
        assert_eq!(waiters.registered(), 0);

        // Past its deadline: the sweep ends it.
        let (_tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut wait = waiters.wait(rx, Instant::now());
        assert!(poll_once(&mut wait).await.is_none());
        waiters.sweep(Instant::now(), false);
        assert!(matches!(poll_once(&mut wait).await, Some(None)));
        drop(wait);

        // Shutdown ends every wait between requests, not the ones of exchanges.
        let (_tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut wait = waiters.wait(rx, Instant::now() + Duration::from_secs(60));
        let (_tx2, rx2) = tokio::sync::oneshot::channel::<u8>();
        let mut busy = waiters.within(rx2, Instant::now() + Duration::from_secs(60));
        assert!(poll_once(&mut wait).await.is_none());
        assert!(poll_once(&mut busy).await.is_none());
        waiters.sweep(Instant::now(), true);
        assert!(matches!(poll_once(&mut wait).await, Some(None)));
        assert!(poll_once(&mut busy).await.is_none());
        drop(wait);
        drop(busy);
        assert_eq!(waiters.registered(), 0);
    }
}
