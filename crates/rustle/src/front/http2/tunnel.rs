//! CONNECT streams (RFC 9113 8.5): a tunnel to `host:port` per stream, relayed between
//! the stream's DATA frames and the upstream socket; WebSocket streams use the same relay
//! after their upgrade. END_STREAM and FIN map to each other, RST_STREAM and socket
//! errors too (CONNECT_ERROR).
//!
//! The tunnel is the relay engine (`relay::run`) between the stream, as an `End`, and the
//! upstream socket: no read buffer while idle, half-close, bandwidth limits and the idle
//! timer as on HTTP/1.1 tunnels. What the stream adds as an end: its window, asked before
//! the upstream is read (`End::poll_room`), so that nothing is read that could not be sent,
//! and given back when unused; a stall timeout while the window stays shut with upstream
//! bytes waiting; the client's reset, watched while both directions wait elsewhere. Client
//! bytes are copied out of the `Bytes` h2 handed over as the relay reads them, and their
//! window given back then; the relay reads no more until the upstream took them, so a slow
//! upstream slows the client down.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant, Sleep};

use super::{client_error, host_port, upstream_tcp, Exchange, Live, Shared};
use crate::acl::Protocol;
use crate::config::SpliceMode;
use crate::error::Error;
use crate::io::relay::{End, Opts, Relay, Stalled};

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
    let (user, params) = (ex.user.clone(), ex.params.clone());
    // Given up as soon as the client resets the stream or leaves.
    let who = (user.as_deref(), params.as_deref());
    let connect = upstream_tcp(shared, who, &host, port, Protocol::Connect);
    let super::Tcp { stream: up, addr, via, early, .. } =
        super::unless_reset(respond, connect).await?;
    ex.upstream = Some(addr);
    ex.via = via;
    let send = respond.send_response(Response::new(()), false).map_err(client_error)?;
    ex.status = 200;
    let io = &shared.worker.cfg().timeouts;
    let mut relay = Tunnel::new(req.into_body(), send, up, io.tunnel_idle, io.io)
        .throttled(&shared.throttle(user.as_deref()))
        .counting(shared.traffic_of(user.as_deref()));
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
        let (totals, result) = ready!(Pin::new(&mut this.relay).poll(cx));
        let (stream, upstream) = this.relay.ends_mut();
        if let Err(e) = &result {
            let reason = match e {
                Error::Upstream(_) | Error::UpstreamClosed(_) => Some(Reason::CONNECT_ERROR),
                Error::Timeout(_) => Some(Reason::CANCEL),
                // The client reset the stream or went away: nothing to tell it.
                _ => None,
            };
            if let Some(r) = reason {
                stream.send.send_reset(r);
            }
        }
        // RFC 9113 8.5: a client's CONNECT_ERROR means its TCP connection failed, which is
        // passed on as a TCP reset; any other reset just closes the upstream.
        if stream.connect_error {
            let _ = socket2::SockRef::from(&*upstream).set_linger(Some(Duration::ZERO));
        }
        this.ex.up += totals.up;
        this.ex.down += totals.down;
        // An upstream failure through parents names the parent it came through.
        let result = result.map_err(|e| {
            e.through(this.ex.via.as_deref().map(crate::telemetry::accesslog::Via::last_parent))
        });
        // A user's relay counted its bytes as they moved (`counting`).
        let counted = match this.ex.user {
            Some(_) => (totals.up, totals.down),
            None => (0, 0),
        };
        this.ex.log_counted(&this._live.0, result.as_ref().err(), counted);
        Poll::Ready(())
    }
}

/// The relay between one stream and one upstream socket.
pub(super) type Tunnel = Relay<Stream, TcpStream>;

/// A CONNECT (or WebSocket) stream as one end of a relay.
pub(super) struct Stream {
    recv: RecvStream,
    send: SendStream<Bytes>,
    /// What h2 handed over and the relay has not read yet (empty: nothing).
    held: Bytes,
    /// The client's END_STREAM came.
    ended: bool,
    /// Window was asked for (`poll_room`).
    reserved: bool,
    /// The client reset the stream with CONNECT_ERROR.
    connect_error: bool,
    /// How long the window may stay shut with upstream bytes waiting.
    stall: Duration,
    /// While it is shut: the stall deadline's timer.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Relay<Stream, TcpStream> {
    pub(super) fn new(
        recv: RecvStream,
        send: SendStream<Bytes>,
        upstream: TcpStream,
        idle: Duration,
        stall: Duration,
    ) -> Tunnel {
        let stream = Stream {
            recv,
            send,
            held: Bytes::new(),
            ended: false,
            reserved: false,
            connect_error: false,
            stall,
            stalled: None,
        };
        let opts = Opts { idle, splice: SpliceMode::Never, grace: None };
        crate::io::relay::run(stream, upstream, b"", b"", opts)
    }

    /// Bytes that came with the upstream's response head (a WebSocket's first frames):
    /// they go first. Few and at once, so h2's buffer takes them without window.
    pub(super) fn send_early(&mut self, early: &[u8]) -> Result<(), Error> {
        if !early.is_empty() {
            let (stream, _) = self.ends_mut();
            stream.send.send_data(Bytes::copy_from_slice(early), false).map_err(client_error)?;
            self.sent_down_before(early.len());
        }
        Ok(())
    }
}

impl Stream {
    fn recv_error(&mut self, e: h2::Error) -> io::Error {
        match e.reason() {
            Some(reason) if e.is_reset() && e.is_remote() => self.reset_by_client(reason),
            _ => io::Error::other(e),
        }
    }

    fn reset_by_client(&mut self, reason: Reason) -> io::Error {
        self.connect_error |= reason == Reason::CONNECT_ERROR;
        io::Error::new(
            io::ErrorKind::ConnectionReset,
            format!("the client reset the stream ({reason})"),
        )
    }
}

impl End for Stream {
    const SOCKET: bool = false;

    fn socket(&self) -> Option<&TcpStream> {
        None
    }

    /// DATA frames: ready once one came, or END_STREAM.
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.held.is_empty() && !self.ended {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => self.held = data,
                Some(Err(e)) => return Poll::Ready(Err(self.recv_error(e))),
                None => self.ended = true,
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_read_ready(cx))?;
        let n = self.held.len().min(buf.len());
        buf[..n].copy_from_slice(&self.held[..n]);
        self.held.advance(n);
        let _ = self.recv.flow_control().release_capacity(n);
        Poll::Ready(Ok(n))
    }

    /// Sends a copy of what was read (at most the room `poll_room` gave, or early bytes
    /// h2 buffers), and gives back window assigned beyond it: held by a quiet tunnel, it
    /// would starve the connection's other streams.
    fn poll_write(&mut self, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.send.send_data(Bytes::copy_from_slice(buf), false).map_err(io::Error::other)?;
        self.release_room();
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The upstream's FIN becomes END_STREAM.
    fn poll_shutdown(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.release_room();
        Poll::Ready(self.send.send_data(Bytes::new(), true).map_err(io::Error::other))
    }

    fn poll_room(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if !self.reserved {
            self.send.reserve_capacity(want);
            self.reserved = true;
        }
        let mut cap = self.send.capacity();
        // Room for nothing would read nothing, which says end of stream: wait for more.
        while cap == 0 {
            match self.send.poll_capacity(cx) {
                Poll::Pending => {
                    // The stall clock runs from the first wait.
                    let stall = self.stall;
                    let timer = self
                        .stalled
                        .get_or_insert_with(|| Box::pin(sleep_until(Instant::now() + stall)));
                    ready!(timer.as_mut().poll(cx));
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, Stalled)));
                }
                Poll::Ready(None) => {
                    let gone = io::Error::new(io::ErrorKind::ConnectionReset, "stream closed");
                    return Poll::Ready(Err(gone));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(io::Error::other(e))),
                Poll::Ready(Some(Ok(n))) => cap = n,
            }
        }
        self.stalled = None;
        Poll::Ready(Ok(cap.min(want)))
    }

    fn release_room(&mut self) {
        if self.reserved {
            self.send.reserve_capacity(0);
            self.reserved = false;
        }
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => Poll::Ready(self.reset_by_client(reason)),
            Poll::Ready(Err(e)) => Poll::Ready(io::Error::other(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}
