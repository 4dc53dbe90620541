//! Waiting for a kept-alive client's next request without a timer or a shutdown watch per
//! wait. A connection between requests registers its waker here with a deadline; the
//! worker's housekeeping tick (every 100 ms) wakes the ones past their deadline, and wakes
//! them all when the worker stops. Registering is a slot in a vector and a waker clone,
//! where a tokio timer plus a watch-channel waiter took two locks and a timer-wheel
//! insertion and removal per request. The price is precision: a keep-alive timeout ends
//! up to one tick late, which nobody can tell from a network delay.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

struct Entry {
    deadline: Instant,
    waker: Waker,
    /// Woken by a sweep: the wait is over.
    fired: bool,
}

/// A worker's waiting connections.
#[derive(Default)]
pub struct Waiters {
    slots: RefCell<Vec<Option<Entry>>>,
    free: RefCell<Vec<usize>>,
}

impl Waiters {
    fn register(&self, deadline: Instant, waker: &Waker) -> usize {
        let entry = Entry { deadline, waker: waker.clone(), fired: false };
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

    /// Wakes the waits past their deadline (all of them with `all`, on shutdown).
    pub fn sweep(&self, now: Instant, all: bool) {
        let mut slots = self.slots.borrow_mut();
        for e in slots.iter_mut().flatten() {
            if !e.fired && (all || e.deadline <= now) {
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

    /// Runs `fut` until it completes (`Some`) or the wait fires (`None`): the deadline
    /// passed or the worker is stopping.
    pub fn wait<'a, F: Future + Unpin>(&'a self, fut: F, deadline: Instant) -> Wait<'a, F> {
        Wait { waiters: self, fut, deadline, slot: None }
    }

    #[cfg(test)]
    fn registered(&self) -> usize {
        self.slots.borrow().iter().flatten().count()
    }
}

/// See `Waiters::wait`.
pub struct Wait<'a, F> {
    waiters: &'a Waiters,
    fut: F,
    deadline: Instant,
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
            None => this.slot = Some(this.waiters.register(this.deadline, cx.waker())),
            Some(i) => {
                if this.waiters.check(i, cx.waker()) {
                    return Poll::Ready(None);
                }
            }
        }
        Poll::Pending
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
    use std::time::Duration;

    /// Polls once: `Some` when ready.
    async fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| match Pin::new(&mut *f).poll(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
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

        // Shutdown ends every wait.
        let (_tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut wait = waiters.wait(rx, Instant::now() + Duration::from_secs(60));
        assert!(poll_once(&mut wait).await.is_none());
        waiters.sweep(Instant::now(), true);
        assert!(matches!(poll_once(&mut wait).await, Some(None)));
        drop(wait);
        assert_eq!(waiters.registered(), 0);
    }
}
