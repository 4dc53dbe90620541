//! Forwarding one absolute-form request to its origin and the response back: an idle
//! pooled connection when there is one, the request head rewritten (origin-form target,
//! hop-by-hop fields removed), bodies streamed both ways, interim responses passed on,
//! and the origin connection parked for reuse when the exchange ended cleanly.

use rustle_proto::http::{
    write_request, write_response, BodyKind, RequestRewrite, ResponseHead, ResponseRewrite, Target,
};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWriteExt};

use super::{Client, Exchange, Next};
use crate::acl::Protocol;
use crate::config::SpliceMode;
use crate::error::{Error, Phase};
use crate::front::exchange::{
    attempt, client_left, is_connection_auth, read_response_head_or, send, write_timed, Leg,
    Outgoing, Pinned, Pins, Requester,
};
use crate::front::tunnel::Handoff;
use crate::front::worker::Worker;
use crate::io::body::{self, Dir, State};
use crate::io::buf::Buf;
use crate::io::conn::Stream;
use crate::upstream::{Connected, Key, Start, Tls, Want};

/// A head and the body bytes that came with it are sent in one write while they fit in
/// this many bytes; larger bodies are streamed after the head.
const COALESCE: usize = 64 * 1024;

/// A timeout long enough never to fire, for waits bounded by something else.
const UNBOUNDED: Duration = Duration::from_secs(365 * 24 * 3600);

/// Name of this proxy in Via headers.
const VIA: &str = "rustle";

/// Pool keys of TLS origins start with this, so a plain connection is never reused for
/// an https:// URL or the other way round.
const HTTPS_KEY: &str = "https://";

/// A connection's pool key, `host:port` with the host lowercased (after `https://` for a
/// TLS origin), kept from request to request: rebuilt only when a request names another
/// origin, so that a kept-alive client's usual request neither writes nor checks it.
#[derive(Debug, Default)]
pub(crate) struct PoolKey {
    text: String,
    port: u16,
    https: bool,
    /// Where the host ends in `text` (it starts after `https://` for a TLS origin).
    host_end: u32,
    /// `text`'s hash in the worker's pool (`upstream::Key`).
    hash: u64,
}

impl PoolKey {
    /// Makes this the key of `host:port` (a TLS origin's when `https`).
    fn target(
        &mut self,
        pool: &crate::upstream::Upstreams,
        https: bool,
        host: &[u8],
        port: u16,
    ) -> Result<(), Error> {
        let same = !self.text.is_empty()
            && self.https == https
            && self.port == port
            && self.host_bytes().eq_ignore_ascii_case(host);
        if same {
            return Ok(());
        }
        let mut bytes = std::mem::take(&mut self.text).into_bytes();
        bytes.clear();
        if https {
            bytes.extend_from_slice(HTTPS_KEY.as_bytes());
        }
        bytes.extend(host.iter().map(u8::to_ascii_lowercase));
        let host_end = u32::try_from(bytes.len())
            .map_err(|_| Error::Unsupported("the host name is too long"))?;
        bytes.push(b':');
        rustle_proto::http::push_decimal(&mut bytes, u32::from(port));
        self.text = String::from_utf8(bytes)
            .map_err(|_| Error::Unsupported("the host name is not ASCII"))?;
        (self.https, self.port, self.host_end) = (https, port, host_end);
        self.hash = pool.key(self.text.as_bytes()).hash();
        Ok(())
    }

    fn host_range(&self) -> std::ops::Range<usize> {
        let start = if self.https { HTTPS_KEY.len() } else { 0 };
        start..self.host_end as usize
    }

    fn host_bytes(&self) -> &[u8] {
        self.text.as_bytes().get(self.host_range()).unwrap_or_default()
    }

    fn host(&self) -> &str {
        self.text.get(self.host_range()).unwrap_or_default()
    }

    fn bytes(&self) -> &[u8] {
        self.text.as_bytes()
    }

    fn key(&self) -> Key<'_> {
        Key::hashed(self.text.as_bytes(), self.hash)
    }
}

pub(super) async fn forward(c: &mut Client, ex: &mut Exchange) -> Result<Next, Error> {
    let worker = c.worker.clone();
    let cfg = worker.cfg();
    let Target::Absolute { host, port, scheme, .. } = c.head.target else {
        return Err(Error::Unsupported("not an absolute-form request"));
    };
    let https = scheme.is_tls();
    let head = &c.head;
    let filled = c.buf.filled();
    // The pool key, `host:port` lowercased (`https://host:port` for TLS origins), kept by
    // the connection: a kept-alive client's next request to the same origin uses it as it
    // is. The host for resolving is in it.
    c.key.target(&worker.upstreams, https, host.get(filled), port)?;
    let key = std::mem::take(&mut c.key);
    let host = key.host();
    let upgrade = head.is_upgrade();
    let method = head.method;
    let client_keep_alive = head.keep_alive();
    let client_http10 = head.minor == 0;
    let expect_continue = head.expect_continue;
    // Connection-based credentials bind the origin connection to this client
    // (`exchange::Pinned`). A look at each field's name length, and a compare for an
    // Authorization field: no allocation.
    let mut pin = head.headers.iter().any(|h| {
        let name = h.name.get(filled);
        name.len() == 13
            && name.eq_ignore_ascii_case(b"authorization")
            && is_connection_auth(h.value.get(filled))
    });

    // Where the request goes (the access rules, a route) and a pooled connection when
    // there is one; a new one is made only once the head and the body bytes in hand have
    // been checked, so that a malformed request never reaches an upstream. (The head is
    // written for the origin, or in absolute form for an HTTP parent.)
    let tls = if https { Tls::Origin } else { Tls::Plain };
    let via_name = cfg.http.via.then_some(VIA);
    // (In a block: what it needs does not stay in the connection's future.)
    let (up, addr, reused, via, pool_key, mut req_body, absolute, mut ubuf) = {
        let policy = worker.policy();
        let user = c.user.clone();
        let params = c.params.clone();
        let want = Want {
            host,
            port,
            protocol: Protocol::Http,
            client: c.peer.ip(),
            addrs: (&c.peer, &c.listener.listen),
            user: user.as_deref(),
            listener: c.listener.name.as_deref(),
            tls,
            local: crate::upstream::local_of(&policy, || c.stream.local_addr()),
            params: params.as_deref(),
            seed: None,
        };
        let mut start = start_or_pinned(&worker, &mut c.pins, &policy, &want, key.key(), &mut pin)?;
        // A route that the target's addresses decide: resolved now (boxed: rare). (Settled
        // in place: `start` is large, and a pooled connection's path should not copy it.)
        if let Start::Connect(plan) = &mut start {
            if plan.undecided() {
                // (The future goes to the heap in a statement of its own: a temporary that
                // lives across the await would take its room in this future.)
                let settle = Box::pin(worker.upstreams.settle(&policy, &want, plan));
                settle.await?;
            }
        }
        let absolute = match &start {
            Start::Ready(ready) => ready.absolute.clone(),
            Start::Connect(plan) => plan.absolute(&want),
        };
        let head = &c.head;
        let filled = c.buf.filled();
        let peer_text;
        let rw = RequestRewrite {
            via: via_name,
            forwarded_for: if cfg.http.forwarded_for {
                peer_text = c.peer.ip().to_string();
                Some(peer_text.as_str())
            } else {
                None
            },
            upgrade,
            absolute: absolute.is_some(),
            proxy_authorization: absolute.as_ref().and_then(|a| a.as_deref()),
        };
        if c.out.capacity() == 0 {
            c.out = worker.take_out();
        }
        c.out.clear();
        write_request(head, filled, &rw, &mut c.out);
        let mut req_body = State::new(head.body);
        c.buf.consume(head.len);
        if !expect_continue {
            let n = body::coalesce(&mut c.buf, &mut req_body, &mut c.out, COALESCE, Dir::Up)?;
            body::Tally { moved: &ex.moved, user: c.traffic.as_deref() }.add(Dir::Up, n);
        }
        let connected = match start {
            Start::Ready(ready) => ready,
            Start::Connect(plan) => {
                // A client that leaves meanwhile ends the attempt.
                let (stream, buf, max) = (&mut c.stream, &mut c.buf, worker.limits().max_head);
                // Boxed whole: this future is part of every kept-alive connection's.
                Box::pin(attempt(&worker, &policy, &want, plan, || {
                    client_left(stream, buf, max, Phase::Connect, false)
                }))
                .await?
            }
        };
        let mut ubuf = worker.take_buf();
        // Bytes a parent passed on before the request went out are the answer's first.
        ubuf.extend_from_slice(&connected.early);
        // A parent told who this client is: the connection is pinned to it, not pooled.
        pin |= connected.private;
        let Connected { stream, addr, reused, via, pool_key, .. } = connected;
        (stream, addr, reused, via, pool_key, req_body, absolute, ubuf)
    };
    ex.upstream = Some(addr);
    ex.via.clone_from(&via);
    let mut rhead = ResponseHead::new();
    rhead.headers = worker.take_fields();
    let io = cfg.timeouts.io;

    // Sent, and the answer's head read, on one path with HTTP/2 (`exchange::send`, which
    // also replaces a pooled connection found dead, for an idempotent request).
    let whole = req_body.is_done();
    let through_parents = via.is_some();
    let mut leg = Leg { stream: up, addr, reused, pool_key, absolute, through_parents, via };
    let mut out = std::mem::take(&mut c.out);
    let mut request = Outgoing { out: &mut out, whole, method, idempotent: method.is_idempotent() };
    let mut again = Again { c: &mut *c, host, port, tls };
    let sent = send(&worker, &mut leg, &mut again, &mut request, &mut ubuf, &mut rhead, io).await;
    c.out = out;
    ex.upstream = Some(leg.addr);
    ex.via.clone_from(&leg.via);
    sent?;
    // (Partly moved out: the rest of `leg` is read in place, so that no copy of it takes
    // room in the connection's future.)
    let Leg { stream: mut up, addr, pool_key, .. } = leg;

    let splice = c.listener.splice != SpliceMode::Never;
    let throttle = c.throttle();
    let limit_up = (!throttle.up.is_unlimited()).then_some(&throttle.up);
    let limit_down = (!throttle.down.is_unlimited()).then_some(&throttle.down);
    let outcome = {
        let out = &mut c.out;
        let cbuf = &mut c.buf;
        // No request body left and the whole answer in hand: the client side is only
        // written (a fresh connection stays unregistered unless a write blocks). An answer
        // still to come from the origin needs the read side too, to watch the client.
        let in_hand = whole && answer_in_hand(&rhead, &ubuf);
        let (mut cr, mut cw) = c.stream.halves(!in_hand);
        let tally = body::Tally { moved: &ex.moved, user: c.traffic.as_deref() };
        let (mut ur, mut uw) = up.split();
        // Stream the request body (if any is left) while watching for the response head.
        // The client's read side comes back with the result: once the body is done, it is
        // watched for the client leaving while the origin prepares its answer.
        let body_fut = async {
            let cr = &mut cr;
            if req_body.is_done() {
                return (Ok(()), cr, cbuf);
            }
            let r =
                body::copy(cr, cbuf, &mut uw, &mut req_body, Dir::Up, io, splice, limit_up, &tally)
                    .await;
            (r, cr, cbuf)
        };
        tokio::pin!(body_fut);
        let mut left = std::pin::pin!(None);
        let mut body_done = whole;
        let mut head_ready = whole;
        loop {
            if head_ready {
                head_ready = false;
                if (100..200).contains(&rhead.status) && rhead.status != 101 {
                    // Interim response (100 Continue and friends): pass it on, read on.
                    out.clear();
                    write_response(&rhead, ubuf.filled(), &ResponseRewrite::default(), out);
                    ubuf.consume(rhead.len);
                    write_timed(&mut cw, out, io).await.map_err(client_side)?;
                } else {
                    break;
                }
            }
            tokio::select! {
                (r, cr, cbuf) = &mut body_fut, if !body_done => {
                    r?;
                    body_done = true;
                    // Boxed, on this path only (a body that did not come with its head), so
                    // that every HTTP connection's state does not grow by it.
                    let watch =
                        client_left_http(&worker, cr, cbuf, Phase::UpstreamHead, false);
                    left.set(Some(Box::pin(watch)));
                }
                // While the request body is still flowing, an origin that waits for all
                // of it before answering is not idle: the body copy has its own timeout.
                r = read_response_head_or(&worker, &mut ur, &mut ubuf, &mut rhead, method,
                                          if body_done { io } else { UNBOUNDED },
                                          left.as_mut().as_pin_mut()) => {
                    r?;
                    head_ready = true;
                }
            }
        }
        if leg.absolute.is_some() && rhead.status == 407 {
            // The parent wants (other) credentials from rustle: not the client's to give.
            return Err(parent_refused(leg.via.as_deref(), rhead.status));
        }
        if rhead.status == 101 {
            if !upgrade || !body_done {
                return Err(Error::BadUpgrade);
            }
            Outcome::Switch
        } else {
            // An HTTP/1.0 client cannot read chunked: strip the framing and close.
            let dechunk = client_http10 && rhead.body == BodyKind::Chunked;
            let client_close = !client_keep_alive
                || rhead.body == BodyKind::CloseDelimited
                || dechunk
                || worker.stopping.get();
            let rrw = ResponseRewrite {
                via: via_name,
                close: client_close || !body_done,
                keep_alive_10: client_http10 && !client_close,
                upgrade: false,
                dechunk,
            };
            // The origin asks for connection-based credentials: the connection is this
            // client's from now on (looked at on a 401 only).
            pin |= rhead.status == 401
                && rhead.headers.iter().any(|h| {
                    let buf = ubuf.filled();
                    h.name.get(buf).eq_ignore_ascii_case(b"www-authenticate")
                        && is_connection_auth(h.value.get(buf))
                });
            let mut resp_body = if dechunk {
                State::Dechunk(rustle_proto::chunked::Scanner::dechunk())
            } else {
                State::new(rhead.body)
            };
            out.clear();
            write_response(&rhead, ubuf.filled(), &rrw, out);
            ubuf.consume(rhead.len);
            let n = body::coalesce(&mut ubuf, &mut resp_body, out, COALESCE, Dir::Down)?;
            tally.add(Dir::Down, n);
            ex.status = rhead.status;
            ex.responded = true;
            ex.unframed = rhead.body == BodyKind::CloseDelimited || dechunk;
            let resp_fut = async {
                write_timed(&mut cw, out, io).await.map_err(client_side)?;
                body::copy(
                    &mut ur,
                    &mut ubuf,
                    &mut cw,
                    &mut resp_body,
                    Dir::Down,
                    io,
                    splice,
                    limit_down,
                    &tally,
                )
                .await
            };
            tokio::pin!(resp_fut);
            // A response may end before the request body does (an early error from the
            // origin): then the rest of the request is not worth waiting for. An answer that
            // takes more than one go is watched for the client leaving (after a tick, and
            // boxed: nothing of it for an answer that goes out at once); a request whose
            // body was streamed is watched already.
            let mut armed = left.is_some() || in_hand;
            let resp_result = loop {
                tokio::select! {
                    biased;
                    r = &mut resp_fut => break r,
                    // Polled once at most: a request body still going, or the client's
                    // read side to hand to the watch.
                    (r, cr, cbuf) = &mut body_fut, if !body_done || !armed => {
                        if !body_done {
                            r?;
                            body_done = true;
                        }
                        if !armed {
                            let watch =
                                client_left_http(&worker, cr, cbuf, Phase::UpstreamBody, true);
                            left.set(Some(Box::pin(watch)));
                            armed = true;
                        }
                    }
                    e = poll_some(left.as_mut().as_pin_mut()) => break Err(e),
                }
            };
            resp_result?;
            Outcome::Done { body_done, client_close }
        }
    };

    match outcome {
        Outcome::Switch => switch_protocols(c, ex, up, ubuf, rhead, via_name).await,
        Outcome::Done { body_done, client_close } => {
            let upstream_reusable =
                rhead.keep_alive() && body_done && ubuf.is_empty() && !worker.stopping.get();
            worker.give_buf(ubuf);
            worker.give_fields(std::mem::take(&mut rhead.headers));
            if upstream_reusable && pin {
                // Authenticated for this client only: kept for it, never pooled.
                let key = key.bytes().into();
                let (via, absolute) = (leg.via, leg.absolute);
                let pinned = Pinned { key, stream: up, addr, via, pool_key, absolute };
                c.pins.keep(pinned);
            } else if upstream_reusable {
                // Back to the worker's pool at once: an idle client holds no origin
                // connection, and its next request (or another client's) takes one there.
                let pool = &worker.upstreams;
                pool.put(pool_key.as_deref().map_or(key.key(), |k| pool.key(k)), up, addr);
            } else {
                // A clean end: a TLS origin gets its close_notify.
                up.close_now();
            }
            c.key = key;
            if !body_done || (client_close && !c.buf.is_empty()) {
                // Unread request bytes would make close() send a reset that can destroy
                // the response still in flight: send FIN first. (Buffered bytes on a
                // kept-alive connection are simply the next, pipelined request.)
                let _ = c.stream.shutdown().await;
                Ok(Next::Close)
            } else if client_close {
                Ok(Next::Close)
            } else {
                Ok(Next::KeepAlive)
            }
        }
    }
}

enum Outcome {
    /// 101 Switching Protocols: the connection becomes a relay.
    Switch,
    /// The response was delivered.
    Done { body_done: bool, client_close: bool },
}

/// A 101 to an upgrade request: the rest of the connection is a relay.
async fn switch_protocols(
    c: &mut Client,
    ex: &mut Exchange,
    up: Stream,
    mut ubuf: Buf,
    rhead: ResponseHead,
    via: Option<&str>,
) -> Result<Next, Error> {
    let worker = c.worker.clone();
    c.out.clear();
    let rrw = ResponseRewrite { via, upgrade: true, ..ResponseRewrite::default() };
    write_response(&rhead, ubuf.filled(), &rrw, &mut c.out);
    ubuf.consume(rhead.len);
    let early_down = ubuf.filled().to_vec();
    worker.give_buf(ubuf);
    write_timed(&mut c.stream, &c.out, worker.cfg().timeouts.io).await.map_err(client_side)?;
    ex.status = 101;
    ex.responded = true;
    let early_up = c.buf.filled().to_vec();
    c.buf.clear();
    let throttle = c.throttle();
    Ok(Next::Tunnel(Handoff {
        upstream: up,
        early_up,
        early_down,
        throttle,
        traffic: c.traffic.clone(),
    }))
}

/// `client_left` for an HTTP exchange, from now on or (`after_tick`, for an answer that
/// is streaming to the client) once a tick has passed.
async fn client_left_http<R: AsyncRead + Unpin>(
    worker: &Worker,
    r: &mut R,
    buf: &mut Buf,
    phase: Phase,
    after_tick: bool,
) -> Error {
    if after_tick {
        let waiters = &worker.waiters;
        let tick = waiters.deadline(Duration::ZERO);
        let _ = waiters.within(std::future::pending::<()>(), tick).await;
    }
    client_left(r, buf, worker.limits().max_head, phase, false).await
}

/// Waits for `fut` when there is one, forever when not.
async fn poll_some<F: Future>(fut: Option<Pin<&mut F>>) -> F::Output {
    match fut {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Whether a response's whole body came with its head (nothing more to read from the
/// origin): a length that the buffer holds, or no body.
fn answer_in_hand(rhead: &ResponseHead, ubuf: &Buf) -> bool {
    if (100..200).contains(&rhead.status) {
        return false;
    }
    match rhead.body {
        BodyKind::None => true,
        BodyKind::Length(n) => ubuf.len().saturating_sub(rhead.len) as u64 >= n,
        BodyKind::Chunked | BodyKind::CloseDelimited => false,
    }
}

/// `write_timed` towards the client: failures are the client's.
fn client_side(e: Error) -> Error {
    match e {
        Error::Upstream(io) => Error::Client(io),
        Error::Timeout(_) => Error::Timeout(Phase::ClientWrite),
        other => other,
    }
}

/// `Upstreams::start`, or the connection pinned to this client for the target (`pinned`
/// set then).
fn start_or_pinned<'p>(
    worker: &Worker,
    pins: &mut Pins,
    policy: &'p crate::policy::Policy,
    want: &Want<'_>,
    key: Key<'_>,
    pinned: &mut bool,
) -> Result<Start<'p>, Error> {
    if let Some(connected) = pins.take(key.bytes, policy, want)? {
        *pinned = true;
        return Ok(Start::Ready(connected));
    }
    worker.upstreams.start(policy, want, Some(key))
}

/// An HTTP parent's refusal of a request sent to it in absolute form.
pub(crate) fn parent_refused(via: Option<&crate::telemetry::accesslog::Via>, status: u16) -> Error {
    let parent = via.map(crate::telemetry::accesslog::Via::last_parent).unwrap_or_default();
    Error::ParentRefused { parent: format!("\"{parent}\"").into(), status }
}

/// HTTP/1's side of `exchange::send`: the client connection watched for leaving, and a
/// new connection to the request's target.
struct Again<'a> {
    c: &'a mut Client,
    host: &'a str,
    port: u16,
    tls: Tls<'a>,
}

impl Requester for Again<'_> {
    fn left(&mut self) -> impl Future<Output = Error> + '_ {
        let max = self.c.worker.limits().max_head;
        client_left(&mut self.c.stream, &mut self.c.buf, max, Phase::UpstreamHead, false)
    }

    fn reconnect(&mut self) -> impl Future<Output = Result<Connected, Error>> + '_ {
        // Boxed: a rare path, and an attempt's state is large.
        Box::pin(self.c.upstream(None, self.host, self.port, Protocol::Http, self.tls))
    }
}
