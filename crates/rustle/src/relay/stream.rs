//! The relay for streams that are not bare sockets (TLS on either side): the same rules
//! as the socket relay (no buffer of its own while idle, backpressure, half-close passed
//! on, one idle timer, bandwidth limits) over `AsyncRead`/`AsyncWrite`. There is no splice
//! here: TLS bytes are not the payload. A TLS destination is flushed whenever its source
//! has nothing more for now, so that nothing encrypted waits inside rustls.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::{Opts, Pending, Pools, Side, Totals, POOLS, SCRATCH};
use crate::error::{Error, Phase};
use crate::limits::{Limit, Throttle};

/// One direction.
struct Dir {
    src: Side,
    dst: Side,
    pending: Option<Pending>,
    /// Bytes went to the destination since its last flush.
    dirty: bool,
    eof: bool,
    done: bool,
    moved: u64,
    pause: Option<Pin<Box<Sleep>>>,
}

impl Dir {
    fn new(src: Side, dst: Side, early: &[u8], pools: &Pools) -> Dir {
        Dir {
            src,
            dst,
            pending: (!early.is_empty()).then(|| Pending { buf: pools.park(early), off: 0 }),
            dirty: false,
            eof: false,
            done: false,
            moved: early.len() as u64,
            pause: None,
        }
    }

    fn poll_move<S, D>(
        &mut self,
        cx: &mut Context<'_>,
        pools: &Pools,
        mut src: Pin<&mut S>,
        mut dst: Pin<&mut D>,
        limit: Option<&Limit>,
        last: &mut Instant,
    ) -> Poll<Result<(), Error>>
    where
        S: AsyncRead + ?Sized,
        D: AsyncWrite + ?Sized,
    {
        loop {
            if let Some(p) = &mut self.pending {
                match ready!(dst.as_mut().poll_write(cx, &p.buf[p.off..])) {
                    Ok(0) => {
                        return Poll::Ready(Err(self.dst.err(io::ErrorKind::WriteZero.into())))
                    }
                    Ok(n) => p.off += n,
                    Err(e) => return Poll::Ready(Err(self.dst.err(e))),
                }
                self.dirty = true;
                if p.off == p.buf.len() {
                    if let Some(p) = self.pending.take() {
                        pools.unpark(p.buf);
                    }
                }
                continue;
            }
            if self.eof {
                ready!(dst.as_mut().poll_flush(cx)).map_err(|e| self.dst.err(e))?;
                // Pass the half-close on (a TLS close_notify, then FIN). The peer may
                // already be gone, which is fine.
                let _ = ready!(dst.as_mut().poll_shutdown(cx));
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            if let Some(sleep) = &mut self.pause {
                ready!(sleep.as_mut().poll(cx));
                self.pause = None;
            }
            let mut allowed = SCRATCH;
            if let Some(limit) = limit {
                let now = Instant::now();
                allowed = limit.take(SCRATCH, now);
                if allowed == 0 {
                    self.pause = Some(Box::pin(tokio::time::sleep(limit.wait(SCRATCH, now))));
                    continue;
                }
            }
            let unused = |got: usize| {
                if let Some(limit) = limit {
                    limit.give_back(allowed - got.min(allowed));
                }
            };
            let mut scratch = pools.scratch.borrow_mut();
            let want = allowed.min(scratch.len());
            let mut rb = ReadBuf::new(&mut scratch[..want]);
            let n = match src.as_mut().poll_read(cx, &mut rb) {
                Poll::Pending => {
                    unused(0);
                    if self.dirty {
                        match dst.as_mut().poll_flush(cx) {
                            Poll::Ready(Ok(())) => self.dirty = false,
                            Poll::Ready(Err(e)) => return Poll::Ready(Err(self.dst.err(e))),
                            Poll::Pending => {}
                        }
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    unused(0);
                    return Poll::Ready(Err(self.src.err(e)));
                }
                Poll::Ready(Ok(())) => rb.filled().len(),
            };
            unused(n);
            if n == 0 {
                self.eof = true;
                continue;
            }
            let taken = match dst.as_mut().poll_write(cx, &scratch[..n]) {
                Poll::Ready(Ok(m)) => m,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.dst.err(e))),
                Poll::Pending => 0,
            };
            if taken < n {
                // The destination is slower: hold the rest, read nothing more.
                self.pending = Some(Pending { buf: pools.park(&scratch[taken..n]), off: 0 });
            }
            self.dirty = true;
            self.moved += n as u64;
            *last = Instant::now();
        }
    }

    fn release(&mut self, pools: &Pools) {
        if let Some(p) = self.pending.take() {
            pools.unpark(p.buf);
        }
    }
}

/// A relay between two streams; resolves like the socket relay.
pub struct Relay<C, U> {
    client: C,
    upstream: U,
    throttle: Option<Box<Throttle>>,
    up: Dir,
    down: Dir,
    opts: Opts,
    last: Instant,
    timer: super::IdleTimer,
}

/// Relays until both directions end; `early_up`/`early_down` go out first.
pub fn run<C, U>(
    client: C,
    upstream: U,
    early_up: &[u8],
    early_down: &[u8],
    opts: Opts,
) -> Relay<C, U>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (up, down) = POOLS.with(|pools| {
        (
            Dir::new(Side::Client, Side::Upstream, early_up, pools),
            Dir::new(Side::Upstream, Side::Client, early_down, pools),
        )
    });
    Relay {
        client,
        upstream,
        throttle: None,
        up,
        down,
        opts,
        last: Instant::now(),
        timer: super::IdleTimer::Unarmed,
    }
}

impl<C, U> Relay<C, U> {
    pub fn throttled(mut self, throttle: &Throttle) -> Self {
        self.throttle = throttle.boxed();
        self
    }

    fn finish(&mut self, result: Result<(), Error>) -> Poll<(Totals, Result<(), Error>)> {
        POOLS.with(|pools| {
            self.up.release(pools);
            self.down.release(pools);
        });
        Poll::Ready((Totals { up: self.up.moved, down: self.down.moved }, result))
    }
}

impl<C, U> Future for Relay<C, U>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    type Output = (Totals, Result<(), Error>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut last = this.last;
        let throttle = this.throttle.as_deref();
        let (up, down) = (&mut this.up, &mut this.down);
        let (client, upstream) = (&mut this.client, &mut this.upstream);
        let failed = POOLS.with(|pools| {
            if !up.done {
                let limit = throttle.map(|t| &t.up);
                let r = up.poll_move(
                    cx,
                    pools,
                    Pin::new(&mut *client),
                    Pin::new(&mut *upstream),
                    limit,
                    &mut last,
                );
                if let Poll::Ready(Err(e)) = r {
                    return Some(e);
                }
            }
            if !down.done {
                let limit = throttle.map(|t| &t.down);
                let r = down.poll_move(
                    cx,
                    pools,
                    Pin::new(&mut *upstream),
                    Pin::new(&mut *client),
                    limit,
                    &mut last,
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
            return this.finish(Ok(()));
        }
        if super::idle_expired(&mut this.timer, this.last, this.opts.idle, cx) {
            // The relay ends the tunnel: each side still open is told so (a TLS side
            // gets its close_notify), as far as that goes without waiting.
            if !this.up.done {
                crate::conn::shutdown_now(&mut this.upstream);
            }
            if !this.down.done {
                crate::conn::shutdown_now(&mut this.client);
            }
            return this.finish(Err(Error::Timeout(Phase::TunnelIdle)));
        }
        Poll::Pending
    }
}
