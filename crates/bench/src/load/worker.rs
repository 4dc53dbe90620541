//! Worker threads and their lanes.
//!
//! A worker thread runs one current-thread runtime with a `LocalSet`; each
//! lane is a local task that owns one connection at a time and has at most
//! one request in flight (HTTP/1.1 without pipelining). Lanes share the
//! thread's statistics through `Rc<RefCell<_>>`: no atomics, no locks.
//!
//! Stopping is exact: a lane checks the deadline (with `--count`, takes one
//! of the run's tickets) before it sends, never after, and an exchange that
//! started is always awaited (bounded by `--timeout`), so every request the
//! server saw is either counted or counted as an error.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Semaphore};
use tokio::task::LocalSet;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::dial::{dial, Stream};
use super::h2;
use super::plan::{Plan, WS_ACCEPT};
use super::response::{Expect, Reader, BUF_LEN, SMALL_BUF_LEN};
use super::stats::{ErrorKind, ThreadStats};
use super::ws::{self, Frames};

/// After a failed connect or a refused tunnel, wait a little before the
/// next try so a dead proxy costs errors at a bounded rate, not a spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Progress shared by all threads in hold mode.
pub(crate) struct HoldSync {
    /// Lanes done with their setup exchange, successfully or not.
    pub(crate) settled: AtomicU64,
    pub(crate) established: AtomicU64,
    pub(crate) open: AtomicU64,
    /// Becomes `true` when the hold is over.
    pub(crate) over: watch::Receiver<bool>,
}

/// What one worker thread does.
pub(crate) struct Job {
    pub(crate) plan: Arc<Plan>,
    /// Global lane indices (they place the lane in the open-loop schedule).
    pub(crate) lanes: Vec<usize>,
    /// Mix mode: how many of this thread's lanes may be active at once.
    pub(crate) active: Option<usize>,
    pub(crate) hold: Option<Arc<HoldSync>>,
    /// HTTP/2 modes: lanes sharing one connection (consecutive lanes of the
    /// thread), a stream each.
    pub(crate) streams: usize,
}

/// An HTTP/2 connection shared by `streams` lanes: the first lane to need
/// it opens it (the others wait on the lock meanwhile), each lane keeps a
/// handle, and a lane whose stream failed clears it unless another lane
/// already put a newer connection in.
#[derive(Default)]
struct H2Slot {
    send: Option<::h2::client::SendRequest<bytes::Bytes>>,
    /// Connections opened into this slot so far; names the current one.
    opened: u64,
}

/// Runs a job to completion; returns its statistics and when it finished.
pub(crate) fn run_thread(job: Job) -> io::Result<(ThreadStats, Instant)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let stats = Rc::new(RefCell::new(ThreadStats::default()));
    let local = LocalSet::new();
    local.block_on(&rt, async {
        let gate = job.active.map(|m| Rc::new(Semaphore::new(m)));
        let setup = Rc::new(Semaphore::new(job.plan.setup));
        let buf_len = if job.hold.is_some() { SMALL_BUF_LEN } else { BUF_LEN };
        let mut tasks = Vec::with_capacity(job.lanes.len());
        let mut slot: Option<Rc<tokio::sync::Mutex<H2Slot>>> = None;
        for (i, index) in job.lanes.into_iter().enumerate() {
            let h2_slot = match job.plan.h2_request {
                Some(_) if i % job.streams.max(1) == 0 => {
                    Some(Rc::clone(slot.insert(Rc::default())))
                }
                Some(_) => slot.clone(),
                None => None,
            };
            let mut lane = Lane {
                plan: Arc::clone(&job.plan),
                stats: Rc::clone(&stats),
                reader: Reader::new(buf_len),
                conn: None,
                h2: None,
                h2_slot,
                h2_opened: 0,
                frames: job.plan.ws_size.map(|n| Frames::new(n, job.plan.seed, index)),
                index,
            };
            let gate = gate.clone();
            let hold = job.hold.clone();
            let setup = Rc::clone(&setup);
            tasks.push(tokio::task::spawn_local(async move {
                match hold {
                    Some(h) => lane.hold(&h, &setup).await,
                    None => lane.drive(gate.as_deref()).await,
                }
            }));
        }
        for t in tasks {
            // A panicking lane loses only its own numbers; the run goes on.
            let _ = t.await;
        }
    });
    let finished = Instant::now();
    let stats = std::mem::take(&mut *stats.borrow_mut());
    Ok((stats, finished))
}

/// A successful exchange.
struct Done {
    bytes: u64,
    /// The connection must be closed now (after the server closes it).
    close: bool,
}

struct Lane {
    plan: Arc<Plan>,
    stats: Rc<RefCell<ThreadStats>>,
    reader: Reader,
    conn: Option<Stream>,
    /// HTTP/2 modes: the lane's handle on its connection, the slot it is
    /// shared through, and which connection of the slot the handle is.
    h2: Option<::h2::client::SendRequest<bytes::Bytes>>,
    h2_slot: Option<Rc<tokio::sync::Mutex<H2Slot>>>,
    h2_opened: u64,
    /// ws mode only.
    frames: Option<Frames>,
    index: usize,
}

impl Lane {
    /// Closed loop, open loop (`--rate`) or mix (`gate`), until the deadline.
    async fn drive(&mut self, gate: Option<&Semaphore>) {
        let plan = Arc::clone(&self.plan);
        if gate.is_some() {
            // Mix: every lane's connection is open before rotation starts.
            match timeout(plan.timeout, self.connect()).await {
                Ok(Ok(())) => {}
                Ok(Err(kind)) => self.fail(kind).await,
                Err(_) => self.fail(ErrorKind::Timeout).await,
            }
        }
        let mut k: u64 = 0;
        loop {
            let mut start = match plan.rate {
                // Request k of lane j is due at (j + k * C) / R: the lanes
                // interleave evenly into one stream of R requests/s.
                Some(rate) => {
                    let at = (self.index as f64 + k as f64 * plan.connections as f64) / rate;
                    k += 1;
                    plan.t0 + Duration::from_secs_f64(at)
                }
                None => Instant::now(),
            };
            if start >= plan.end || !plan.take_ticket() {
                return;
            }
            if plan.rate.is_some() {
                // Latency counts from `start`, the scheduled time, even if
                // this lane is late: no coordinated omission.
                sleep_until(start).await;
            }
            let permit = match gate {
                Some(g) => match g.acquire().await {
                    Ok(p) => Some(p),
                    Err(_) => return,
                },
                None => None,
            };
            if permit.is_some() {
                start = Instant::now();
                if start >= plan.end {
                    return;
                }
                if let Some(s) = &mut self.conn {
                    // An idle connection the peer closed is reopened, as a
                    // browser would, rather than failing the next request.
                    if !s.is_open().await {
                        self.conn = None;
                    }
                }
            }
            let result = timeout(plan.timeout, self.exchange()).await;
            let done = Instant::now();
            // Release before cleanup: the next lane may go while we close.
            drop(permit);
            self.settle(result, start, done).await;
        }
    }

    /// Hold mode: one exchange, then idle until the hold is over.
    async fn hold(&mut self, sync: &HoldSync, setup: &Semaphore) {
        let permit = setup.acquire().await;
        let start = Instant::now();
        let result = timeout(self.plan.timeout, self.exchange()).await;
        drop(permit);
        let ok = self.settle(result, start, Instant::now()).await && self.conn.is_some();
        // Idle lanes need no read buffer: give the memory back.
        self.reader = Reader::new(0);
        if ok {
            sync.established.fetch_add(1, Ordering::Relaxed);
        }
        sync.settled.fetch_add(1, Ordering::Release);
        if !ok {
            return;
        }
        let mut over = sync.over.clone();
        while !*over.borrow_and_update() {
            if over.changed().await.is_err() {
                break;
            }
        }
        if let Some(s) = &mut self.conn {
            if s.is_open().await {
                sync.open.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Accounts for one exchange; returns whether it succeeded.
    async fn settle(
        &mut self,
        result: Result<Result<Done, ErrorKind>, tokio::time::error::Elapsed>,
        start: Instant,
        done: Instant,
    ) -> bool {
        match result {
            Ok(Ok(d)) => {
                if start >= self.plan.warm_end {
                    self.stats.borrow_mut().record(done - start, d.bytes);
                }
                if d.close {
                    self.close().await;
                }
                true
            }
            Ok(Err(kind)) => {
                self.fail(kind).await;
                false
            }
            Err(_) => {
                self.fail(ErrorKind::Timeout).await;
                false
            }
        }
    }

    async fn fail(&mut self, kind: ErrorKind) {
        self.stats.borrow_mut().errors.add(kind);
        // A well-framed non-2xx leaves a reusable connection (the exchange
        // already dropped it if not); any other failure leaves it unusable.
        if kind != ErrorKind::BadStatus {
            self.conn = None;
            self.drop_h2().await;
        }
        if matches!(kind, ErrorKind::Connect | ErrorKind::ProxyRefused) {
            sleep(ERROR_BACKOFF).await;
        }
    }

    /// Ends a `Connection: close` exchange (or a ws `--close` session) by
    /// waiting for the server to close first; failures are counted, but the
    /// exchange itself already counted as complete.
    async fn close(&mut self) {
        let Some(mut s) = self.conn.take() else { return };
        let finish = async {
            match &self.frames {
                Some(f) => ws::close(&mut s, &mut self.reader, f).await,
                None => self.reader.expect_eof(&mut s).await,
            }
        };
        let kind = match timeout(self.plan.timeout, finish).await {
            Ok(Ok(())) => {
                // A TLS client ends its side with close_notify, as browsers and curl do, so
                // that the server sees a clean end rather than a truncation.
                let _ = timeout(self.plan.timeout, s.close_notify()).await;
                return;
            }
            Ok(Err(kind)) => kind,
            Err(_) => ErrorKind::Timeout,
        };
        self.stats.borrow_mut().errors.add(kind);
    }

    /// Opens the lane's connection (with the ws upgrade in ws mode).
    async fn connect(&mut self) -> Result<(), ErrorKind> {
        let mut s = dial(&self.plan, &mut self.reader).await?;
        if self.frames.is_some() {
            s.write_all(&self.plan.request).await.map_err(|_| ErrorKind::Write)?;
            s.flush().await.map_err(|_| ErrorKind::Write)?;
            let resp = self.reader.response(&mut s, Expect::Upgrade(WS_ACCEPT)).await?;
            if resp.status != 101 {
                return Err(ErrorKind::BadStatus);
            }
        }
        self.conn = Some(s);
        Ok(())
    }

    /// One stream on the lane's HTTP/2 connection, opened first if the slot
    /// has none.
    async fn h2_exchange(&mut self) -> Result<Done, ErrorKind> {
        let plan = Arc::clone(&self.plan);
        let Some(req) = &plan.h2_request else { return Err(ErrorKind::Connect) };
        if self.h2.is_none() {
            let Some(slot) = self.h2_slot.clone() else { return Err(ErrorKind::Connect) };
            let mut slot = slot.lock().await;
            if slot.send.is_none() {
                slot.send = Some(h2::connect(&plan, &mut self.reader).await?);
                slot.opened += 1;
            }
            self.h2 = slot.send.clone();
            self.h2_opened = slot.opened;
        }
        let Some(send) = &mut self.h2 else { return Err(ErrorKind::Connect) };
        let bytes = h2::exchange(send, req).await?;
        if plan.close {
            // The connection task ends once no handle is left.
            self.drop_h2().await;
        }
        Ok(Done { bytes, close: false })
    }

    /// Lets go of the lane's HTTP/2 connection, and of the slot's if it is
    /// still that one.
    async fn drop_h2(&mut self) {
        if self.h2.take().is_none() {
            return;
        }
        if let Some(slot) = &self.h2_slot {
            let mut slot = slot.lock().await;
            if slot.opened == self.h2_opened {
                slot.send = None;
            }
        }
    }

    /// One request and its complete response (or one ws message and echo).
    async fn exchange(&mut self) -> Result<Done, ErrorKind> {
        if self.plan.h2_request.is_some() {
            return self.h2_exchange().await;
        }
        if self.conn.is_none() {
            self.connect().await?;
        }
        // `connect` succeeded, so there is a connection; the arm is unreachable.
        let Some(s) = self.conn.as_mut() else { return Err(ErrorKind::Connect) };
        if let Some(f) = &self.frames {
            let bytes = ws::exchange(s, &mut self.reader, f).await?;
            return Ok(Done { bytes, close: self.plan.close });
        }
        s.write_all(&self.plan.request).await.map_err(|_| ErrorKind::Write)?;
        s.flush().await.map_err(|_| ErrorKind::Write)?;
        let resp = self.reader.response(s, Expect::Normal).await?;
        let close = resp.close || self.plan.close;
        if !close && !self.reader.buffered().is_empty() {
            // Bytes nobody asked for: the response was framed wrong.
            return Err(ErrorKind::Parse);
        }
        if !(200..300).contains(&resp.status) {
            if close {
                self.conn = None;
            }
            return Err(ErrorKind::BadStatus);
        }
        Ok(Done { bytes: resp.bytes, close })
    }
}
