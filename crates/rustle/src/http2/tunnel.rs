//! CONNECT streams (RFC 9113 8.5): a tunnel to `host:port` per stream, relayed between
//! the stream's DATA frames and the upstream socket; WebSocket streams use the same relay
//! after their upgrade. END_STREAM and FIN map to each other, RST_STREAM and socket
//! errors too (CONNECT_ERROR).
//!
//! An open tunnel is a task of its own holding only the two stream handles, the socket,
//! counters and one timer: no read buffer while idle. A direction waits for readiness
//! owning nothing; the upstream side reads into the worker's scratch buffer only once the
//! client's window has room, and sends a copy of exactly what was read. Client bytes stay
//! in the `Bytes` h2 handed over until the upstream took them, and only then is their
//! window given back, so a slow upstream slows the client down.
//!
//! Bandwidth limits (the listener's and the user's, as on HTTP/1.1 tunnels) are asked
//! before each write up and each read down; a direction the limit stops sleeps until its
//! buckets refill. An unlimited tunnel carries no limit state at all.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Sleep;

use super::{client_error, client_gone, host_port, upstream_tcp, Exchange, Live, Shared};
use crate::acl::Protocol;
use crate::error::{Error, Phase};
use crate::limits::{Direction, Throttle};

/// Most bytes read from an upstream at once (and sent as one `send_data`, which h2 cuts
/// into frames). Bulk transfers move in few syscalls; the copy is made at the size read.
const READ: usize = 64 * 1024;

thread_local! {
    /// Each worker is a thread: its tunnels share one read buffer.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; READ]);
}

/// A CONNECT stream: connects (access rules first), answers 200, and returns the tunnel
/// task to spawn.
pub(super) async fn connect(
    shared: &Rc<Shared>,
    ex: &mut Exchange,
    req: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    live: Live,
) -> Result<Option<Task>, Error> {
    let (host, port) = host_port(req.uri().authority(), None)?;
    let user = ex.user.clone();
    // Given up as soon as the client resets the stream or leaves.
    let connect = upstream_tcp(shared, user.as_deref(), &host, port, Protocol::Connect);
    let super::Tcp { stream: up, addr, via, early, .. } =
        super::unless_reset(respond, connect).await?;
    ex.upstream = Some(addr);
    ex.via = via;
    let send = respond.send_response(Response::new(()), false).map_err(client_error)?;
    ex.status = 200;
    let io = &shared.worker.cfg().timeouts;
    let mut relay = Tunnel::new(req.into_body(), send, up, io.tunnel_idle, io.io)
        .throttled(&shared.throttle(user.as_deref()));
    // What the last parent passed on with its reply goes first.
    relay.send_early(&early)?;
    Ok(Some(Task { relay, ex: ex.take(), _live: live }))
}

/// A tunnel and the log line it writes when it ends.
pub(super) struct Task {
    relay: Tunnel,
    ex: Exchange,
    _live: Live,
}

impl Task {
    pub(super) fn new(relay: Tunnel, ex: Exchange, live: Live) -> Task {
        Task { relay, ex, _live: live }
    }
}

impl Future for Task {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let result = ready!(this.relay.poll(cx));
        if let Err(e) = &result {
            let reason = match e {
                Error::Upstream(_) | Error::UpstreamClosed(_) => Some(Reason::CONNECT_ERROR),
                Error::Timeout(_) => Some(Reason::CANCEL),
                // The client reset the stream or went away: nothing to tell it.
                _ => None,
            };
            if let Some(r) = reason {
                this.relay.send.send_reset(r);
            }
        }
        this.ex.up += this.relay.up;
        this.ex.down += this.relay.down;
        // An upstream failure through parents names the parent it came through.
        let result = result
            .map_err(|e| e.through(this.ex.via.as_deref().map(crate::accesslog::Via::last_parent)));
        this.ex.log(&this._live.0, result.as_ref().err());
        Poll::Ready(())
    }
}

/// The relay between one stream and one upstream socket.
pub(super) struct Tunnel {
    recv: RecvStream,
    send: SendStream<Bytes>,
    upstream: TcpStream,
    /// Client bytes the upstream has not taken yet (empty: none).
    pending: Bytes,
    /// The client's END_STREAM was passed on as a FIN.
    up_done: bool,
    /// The upstream's FIN was passed on as END_STREAM.
    down_done: bool,
    /// The upstream is readable and window was asked for.
    reserved: bool,
    /// Since when the upstream has bytes the client's window does not let through.
    stalled: Option<Instant>,
    up: u64,
    down: u64,
    last: Instant,
    idle: Duration,
    stall: Duration,
    timer: Pin<Box<Sleep>>,
    /// Bandwidth limits; None (nothing kept) for an unlimited tunnel.
    limits: Option<Box<Limits>>,
}

/// A limited tunnel's buckets, and each direction's wait for them to refill.
struct Limits {
    throttle: Throttle,
    up: Option<Pin<Box<Sleep>>>,
    down: Option<Pin<Box<Sleep>>>,
}

impl Limits {
    /// Bytes that may move in `dir` now, at most `want`; 0 after arming that direction's
    /// wait, which must then be polled.
    fn take(&mut self, dir: Direction, want: usize) -> usize {
        let now = Instant::now();
        let n = self.throttle.take(dir, want, now);
        if n == 0 {
            let sleep = Box::pin(tokio::time::sleep(self.throttle.wait(dir, want, now)));
            *self.pause(dir) = Some(sleep);
        }
        n
    }

    fn pause(&mut self, dir: Direction) -> &mut Option<Pin<Box<Sleep>>> {
        match dir {
            Direction::Up => &mut self.up,
            Direction::Down => &mut self.down,
        }
    }

    /// Ready once `dir` is not waiting for its buckets.
    fn poll_pause(&mut self, dir: Direction, cx: &mut Context<'_>) -> Poll<()> {
        let pause = self.pause(dir);
        if let Some(sleep) = pause {
            ready!(sleep.as_mut().poll(cx));
            *pause = None;
        }
        Poll::Ready(())
    }
}

impl Tunnel {
    pub(super) fn new(
        recv: RecvStream,
        send: SendStream<Bytes>,
        upstream: TcpStream,
        idle: Duration,
        stall: Duration,
    ) -> Tunnel {
        // A stream that arrived with END_STREAM has nothing to send up.
        let up_done = recv.is_end_stream();
        if up_done {
            let _ = socket2::SockRef::from(&upstream).shutdown(std::net::Shutdown::Write);
        }
        Tunnel {
            recv,
            send,
            upstream,
            pending: Bytes::new(),
            up_done,
            down_done: false,
            reserved: false,
            stalled: None,
            up: 0,
            down: 0,
            last: Instant::now(),
            idle,
            stall,
            timer: Box::pin(tokio::time::sleep(idle.min(stall))),
            limits: None,
        }
    }

    /// Applies bandwidth limits (nothing is kept for an unlimited throttle).
    pub(super) fn throttled(mut self, throttle: &Throttle) -> Tunnel {
        if !throttle.is_unlimited() {
            self.limits =
                Some(Box::new(Limits { throttle: throttle.clone(), up: None, down: None }));
        }
        self
    }

    /// Bytes that came with the upstream's response head (a WebSocket's first frames):
    /// they go first. Few and at once, so h2's buffer takes them without window.
    pub(super) fn send_early(&mut self, early: &[u8]) -> Result<(), Error> {
        if !early.is_empty() {
            self.send.send_data(Bytes::copy_from_slice(early), false).map_err(client_error)?;
            self.down += early.len() as u64;
            if let Some(limits) = &self.limits {
                limits.throttle.charge(Direction::Down, early.len(), Instant::now());
            }
        }
        Ok(())
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if !self.up_done {
            if let Poll::Ready(Err(e)) = self.poll_up(cx) {
                return Poll::Ready(Err(e));
            }
        }
        let was_stalled = self.stalled.is_some();
        if !self.down_done {
            if let Poll::Ready(Err(e)) = self.poll_down(cx) {
                return Poll::Ready(Err(e));
            }
        }
        if self.up_done && self.down_done {
            // An upstream that died after its end of stream (see `relay::cut_after_end`).
            let cut = crate::relay::reset_after_end(&self.upstream);
            return Poll::Ready(cut.map_or(Ok(()), |e| Err(Error::Upstream(e))));
        }
        // A reset arriving while both directions wait elsewhere (the client already
        // ended its side, the upstream is quiet) would otherwise go unnoticed.
        match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => return Poll::Ready(Err(self.reset_by_client(reason))),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(client_error(e))),
            Poll::Pending => {}
        }
        if !was_stalled && self.stalled.is_some() {
            // The stall clock runs from now: make sure the timer fires in time for it.
            let at = tokio::time::Instant::now() + self.stall;
            if at < self.timer.deadline() {
                self.timer.as_mut().reset(at);
            }
        }
        // One timer, moved only when it fires.
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let mut next = self.last + self.idle;
            if now >= next {
                return Poll::Ready(Err(Error::Timeout(Phase::TunnelIdle)));
            }
            if let Some(since) = self.stalled {
                if now.duration_since(since) >= self.stall {
                    return Poll::Ready(Err(Error::Timeout(Phase::ClientWrite)));
                }
                next = next.min(since + self.stall);
            }
            self.timer.as_mut().reset(tokio::time::Instant::from_std(next));
        }
        Poll::Pending
    }

    /// Client to upstream: DATA frames written on, window released as the upstream
    /// takes them; END_STREAM becomes a FIN.
    fn poll_up(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            if !self.pending.is_empty() {
                let mut allowed = self.pending.len();
                if let Some(limits) = &mut self.limits {
                    ready!(limits.poll_pause(Direction::Up, cx));
                    allowed = limits.take(Direction::Up, allowed);
                    if allowed == 0 {
                        continue;
                    }
                }
                let written = match self.upstream.poll_write_ready(cx) {
                    Poll::Ready(Ok(())) => self.upstream.try_write(&self.pending[..allowed]),
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                };
                if let Some(limits) = &self.limits {
                    let n = *written.as_ref().unwrap_or(&0);
                    limits.throttle.give_back(Direction::Up, allowed - n);
                }
                match written {
                    Ok(n) => {
                        self.pending.advance(n);
                        let _ = self.recv.flow_control().release_capacity(n);
                        self.up += n as u64;
                        self.last = Instant::now();
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // Not writable yet (or readiness was stale): wait for epoll.
                        ready!(self.upstream.poll_write_ready(cx)).map_err(Error::Upstream)?;
                    }
                    Err(e) => return Poll::Ready(Err(Error::Upstream(e))),
                }
                continue;
            }
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => self.pending = data,
                Some(Err(e)) => return Poll::Ready(Err(self.recv_error(e))),
                None => {
                    // The peer may already be gone, which is fine: the other direction
                    // finds out.
                    let _ =
                        socket2::SockRef::from(&self.upstream).shutdown(std::net::Shutdown::Write);
                    self.up_done = true;
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }

    /// Upstream to client: read only once the client's window has room, send what was
    /// read; a FIN becomes END_STREAM.
    fn poll_down(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            if !self.reserved {
                if let Some(limits) = &mut self.limits {
                    ready!(limits.poll_pause(Direction::Down, cx));
                }
                ready!(self.upstream.poll_read_ready(cx)).map_err(Error::Upstream)?;
                self.send.reserve_capacity(READ);
                self.reserved = true;
            }
            let mut cap = self.send.capacity();
            if cap == 0 {
                match self.send.poll_capacity(cx) {
                    Poll::Pending => {
                        self.stalled.get_or_insert_with(Instant::now);
                        return Poll::Pending;
                    }
                    Poll::Ready(None) => return Poll::Ready(Err(client_gone())),
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(client_error(e))),
                    Poll::Ready(Some(Ok(n))) => cap = n,
                }
            }
            self.stalled = None;
            let mut want = cap.min(READ);
            if let Some(limits) = &mut self.limits {
                want = limits.take(Direction::Down, want);
                if want == 0 {
                    // Wait for the buckets without holding the client's window.
                    self.send.reserve_capacity(0);
                    self.reserved = false;
                    continue;
                }
            }
            let upstream = &self.upstream;
            let read = SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                upstream.try_read(&mut s[..want]).map(|n| Bytes::copy_from_slice(&s[..n]))
            });
            self.reserved = false;
            if let Some(limits) = &self.limits {
                let n = read.as_ref().map_or(0, |d| d.len());
                limits.throttle.give_back(Direction::Down, want - n);
            }
            match read {
                Ok(data) if data.is_empty() => {
                    self.send.reserve_capacity(0);
                    self.send.send_data(data, true).map_err(client_error)?;
                    self.down_done = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(data) => {
                    if data.len() < want {
                        drained(&self.upstream);
                    }
                    self.down += data.len() as u64;
                    self.last = Instant::now();
                    self.send.send_data(data, false).map_err(client_error)?;
                    // Give back window assigned beyond what was sent: held by a quiet
                    // tunnel, it would starve the connection's other streams.
                    self.send.reserve_capacity(0);
                }
                // Readiness was stale: give the window back and wait again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.send.reserve_capacity(0),
                Err(e) => return Poll::Ready(Err(Error::Upstream(e))),
            }
        }
    }

    fn recv_error(&self, e: h2::Error) -> Error {
        match e.reason() {
            Some(reason) if e.is_reset() && e.is_remote() => self.reset_by_client(reason),
            _ => client_error(e),
        }
    }

    /// RFC 9113 8.5: a client's CONNECT_ERROR means its TCP connection failed, which is
    /// passed on as a TCP reset; any other reset just closes the upstream.
    fn reset_by_client(&self, reason: Reason) -> Error {
        if reason == Reason::CONNECT_ERROR {
            let _ = socket2::SockRef::from(&self.upstream).set_linger(Some(Duration::ZERO));
        }
        Error::Client(io::Error::new(
            io::ErrorKind::ConnectionReset,
            format!("the client reset the stream ({reason})"),
        ))
    }
}

/// A read that returned less than asked for emptied the socket: clear tokio's cached
/// readiness without a syscall, so the next wait goes to epoll.
fn drained(s: &TcpStream) {
    let _ = s.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
}
