//! Proxied requests on HTTP/2 streams, sent to their origin as HTTP/1.1 through the
//! worker's pool; and RFC 8441 WebSocket streams, sent as HTTP/1.1 upgrades whose 101
//! turns the stream into a tunnel.
//!
//! Request bodies are framed for HTTP/1.1 as the client framed them: a `content-length`
//! is kept (h2 checks the DATA frames add up to it), otherwise chunked, with the client's
//! trailers in the last chunk. A body-less request that did not say so on its HEADERS
//! frame is recognised by waiting for its first DATA frame, so that a GET does not go
//! out chunked. Response bodies lose their HTTP/1.1 framing; the trailer section of a
//! chunked response becomes the stream's trailers.
//!
//! Per request, allocations are kept few (malloc and free are a visible share of a small
//! exchange's CPU): the pool key is formatted on the stack, heads are written without
//! intermediate strings.

use std::io::Write as _;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use rustle_proto::http::{
    h2_response_fields, is_h2_trailer_kept, write_h2_request, BodyKind, H2Request, Method,
    RequestRewrite, ResponseHead,
};
use tokio::io::{AsyncRead, AsyncWrite};

use super::tunnel::{Task, Tunnel};
use super::{
    authority, client_error, host_port, send_all, unless_reset, upstream, upstream_tcp, Exchange,
    Live, Reset, Shared, Tcp,
};
use crate::acl::Protocol;
use crate::error::{Error, Phase};
use crate::front::exchange::{
    is_connection_auth, read_response_head_or, send, write_timed, Leg, Outgoing, Pinned, Requester,
};
use crate::io::body::{self, Dir, State};
use crate::io::buf::Buf;
use crate::limits::{Direction as LimitDir, Limit};
use crate::upstream::{Connected, Tls};

const HTTP: Protocol = Protocol::Http;

/// A timeout long enough never to fire, for waits bounded by something else.
const UNBOUNDED: Duration = Duration::from_secs(365 * 24 * 3600);

/// Name of this proxy in Via headers.
const VIA: &str = "rustle";

/// How a request body goes to the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// A proxied request (`:scheme http`).
pub(super) async fn forward(
    shared: &Rc<Shared>,
    ex: &mut Exchange,
    req: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
) -> Result<(), Error> {
    let (parts, mut body) = req.into_parts();
    let target = authority(&parts)?;
    let https = match parts.uri.scheme_str() {
        Some("https") => true,
        _ => {
            check_scheme(&parts)?;
            false
        }
    };
    let (host, port) = host_port(Some(&target), Some(if https { 443 } else { 80 }))?;
    let io = shared.worker.cfg().timeouts.io;
    let mut framing = match content_length(&parts.headers)? {
        _ if body.is_end_stream() => Framing::None,
        Some(n) => Framing::Length(n),
        None => Framing::Chunked,
    };
    // A client waiting for 100 Continue sends nothing until it comes: do not wait for it.
    let expect = parts.headers.get(http::header::EXPECT).is_some();
    let mut first = None;
    while framing == Framing::Chunked && !expect && first.is_none() {
        match body::timed(body.data(), io).await {
            None => return Err(Error::Timeout(Phase::ClientBody)),
            Some(None) => framing = Framing::None,
            // An empty DATA frame (typically the one carrying END_STREAM) says nothing.
            Some(Some(Ok(data))) if data.is_empty() => {}
            Some(Some(Ok(data))) => first = Some(data),
            Some(Some(Err(e))) => return Err(client_error(e)),
        }
    }
    let mut out = Vec::with_capacity(1024);
    // Of the method, only HEAD changes how a response is framed (CONNECT never comes here).
    let method = if parts.method == http::Method::HEAD { Method::Head } else { Method::Get };
    // Pool keys as HTTP/1.1 makes them: TLS origins under `https://host:port`.
    let mut key_buf = [0u8; 320];
    let key = pool_key(&mut key_buf, https, &host, port);
    let (user, params) = (ex.user.clone(), ex.params.clone());
    let who = (user.as_deref(), params.as_deref());
    let tls = if https { Tls::Origin } else { Tls::Plain };
    // Connection-based credentials, or a connection already pinned for this target, bind
    // the origin connection to this client connection (`exchange::Pinned`).
    let auth = parts.headers.get_all(http::header::AUTHORIZATION);
    let mut pin =
        auth.iter().any(|v| is_connection_auth(v.as_bytes())) || shared.pins.borrow().holds(&key);
    let Connected { stream: up, addr, reused, via, absolute, early, pool_key, private } = {
        let connect = upstream(shared, who, Some(&key), &host, port, HTTP, tls);
        unless_reset(respond, connect).await?
    };
    // A parent told who this client is: the connection is pinned to it, not pooled.
    pin |= private;
    // The head goes to the origin, or in absolute form to a parent proxy.
    let method_str = parts.method.as_str();
    let auth = absolute.as_ref().map(|a| a.as_deref());
    write_head(shared, &parts, &target, method_str, framing, auth, &mut out);
    ex.upstream = Some(addr);
    ex.via.clone_from(&via);
    let worker = shared.worker.clone();
    let mut ubuf = worker.take_buf();
    // Bytes a parent passed on before the request went out are the answer's first.
    ubuf.extend_from_slice(&early);
    let mut rhead = ResponseHead::new();
    rhead.headers.reserve(16);

    // Sent, and the answer's head read, on one path with HTTP/1 (`exchange::send`, which
    // also replaces a pooled connection found dead, for an idempotent request).
    let whole = framing == Framing::None;
    let through_parents = ex.via.is_some();
    let mut leg = Leg { stream: up, addr, reused, pool_key, absolute, through_parents, via };
    let mut request =
        Outgoing { out: &mut out, whole, method, idempotent: parts.method.is_idempotent() };
    let mut again = Again { shared, respond: &mut *respond, who, host: &host, port, tls };
    let sent = send(&worker, &mut leg, &mut again, &mut request, &mut ubuf, &mut rhead, io).await;
    ex.upstream = Some(leg.addr);
    ex.via.clone_from(&leg.via);
    if let Err(e) = sent {
        worker.give_buf(ubuf);
        return Err(e);
    }
    let Leg { stream: mut up, addr, pool_key, absolute, .. } = leg;
    let to_parent = absolute.is_some();

    let mut send: Option<SendStream<Bytes>> = None;
    // Request body bytes sent, counted as they go: the response may end first.
    let sent_up = std::cell::Cell::new(0);
    let result = {
        let (mut ur, mut uw) = up.split();
        let throttle = shared.throttle(user.as_deref());
        let limit = |dir| Some(throttle.dir(dir)).filter(|l| !l.is_unlimited());
        let (up_limit, down_limit) = (limit(LimitDir::Up), limit(LimitDir::Down));
        let body_fut = send_body(&mut body, first, &mut uw, framing, io, &sent_up, up_limit);
        tokio::pin!(body_fut);
        let mut body_done = whole;
        let mut head_ready = whole;
        let mut outcome = Ok(());
        // The response head, passing interim responses on, while the body goes up.
        loop {
            if head_ready {
                head_ready = false;
                if (100..200).contains(&rhead.status) && rhead.status != 101 {
                    let interim = response(&rhead, ubuf.filled(), None);
                    ubuf.consume(rhead.len);
                    if let Ok(r) = interim {
                        let _ = respond.send_informational(r);
                    }
                } else {
                    break;
                }
            }
            // Once the body is done, a reset of the stream ends the wait (while it flows, the
            // body's own read ends with the reset).
            let mut reset = Reset(respond);
            let watch = body_done.then(|| std::pin::Pin::new(&mut reset));
            tokio::select! {
                r = &mut body_fut, if !body_done => match r {
                    Ok(_) => body_done = true,
                    Err(e) => { outcome = Err(e); break; }
                },
                r = read_response_head_or(&worker, &mut ur, &mut ubuf, &mut rhead, method,
                                          if body_done { io } else { UNBOUNDED }, watch) => match r {
                    Ok(()) => head_ready = true,
                    Err(e) => { outcome = Err(e); break; }
                },
            }
        }
        match outcome {
            Err(e) => Err(e),
            Ok(()) if rhead.status == 101 => Err(Error::BadUpgrade),
            // The parent wants (other) credentials from rustle: not the client's to give.
            Ok(()) if to_parent && rhead.status == 407 => {
                Err(Error::ParentRefused { parent: last_parent(ex), status: 407 })
            }
            Ok(()) => {
                // The origin asks for connection-based credentials (looked at on a 401).
                pin |= rhead.status == 401
                    && rhead.headers.iter().any(|h| {
                        let buf = ubuf.filled();
                        h.name.get(buf).eq_ignore_ascii_case(b"www-authenticate")
                            && is_connection_auth(h.value.get(buf))
                    });
                let via = shared.worker.cfg().http.via;
                let resp = response(&rhead, ubuf.filled(), via.then_some(VIA))?;
                ubuf.consume(rhead.len);
                let mut state = match rhead.body {
                    BodyKind::Chunked => State::Dechunk(rustle_proto::chunked::Scanner::dechunk()),
                    kind => State::new(kind),
                };
                let empty = state.is_done();
                let s = respond.send_response(resp, empty).map_err(client_error)?;
                ex.status = rhead.status;
                let s = send.insert(s);
                let resp_fut =
                    send_response_body(&mut ur, &mut ubuf, s, &mut state, io, down_limit);
                tokio::pin!(resp_fut);
                // A response may end before the request body does (an early error from
                // the origin): then the rest of the request is not worth waiting for.
                loop {
                    tokio::select! {
                        r = &mut body_fut, if !body_done => match r {
                            Ok(_) => body_done = true,
                            Err(e) => break Err(e),
                        },
                        r = &mut resp_fut => break r.map(|n| { ex.down += n; body_done }),
                    }
                }
            }
        }
    };
    ex.up += sent_up.get();
    match result {
        Ok(body_done) => {
            let reusable =
                rhead.keep_alive() && body_done && ubuf.is_empty() && !worker.stopping.get();
            worker.give_buf(ubuf);
            if reusable && pin {
                // Authenticated for this client connection only: kept for its streams.
                let via = ex.via.clone();
                let pinned = Pinned { key: key.into(), stream: up, addr, via, pool_key, absolute };
                shared.pins.borrow_mut().keep(pinned);
            } else if reusable {
                let pool = &worker.upstreams;
                pool.put(pool.key(pool_key.as_deref().unwrap_or(&key)), up, addr);
            } else {
                // A clean end: a TLS origin gets its close_notify.
                up.close_now();
            }
            Ok(())
        }
        Err(e) => {
            worker.give_buf(ubuf);
            if let Some(s) = &mut send {
                // The response began: all that can be said now is a reset.
                let reason = match e {
                    Error::Client(_) | Error::ClientLeft(_) => Reason::CANCEL,
                    Error::Timeout(_) => Reason::CANCEL,
                    _ => Reason::INTERNAL_ERROR,
                };
                s.send_reset(reason);
            }
            Err(e)
        }
    }
}

/// A WebSocket stream (extended CONNECT, `:protocol websocket`): an HTTP/1.1 upgrade to
/// the origin; its 101 becomes a 200 on the stream, and the stream a tunnel.
pub(super) async fn websocket(
    shared: &Rc<Shared>,
    ex: &mut Exchange,
    req: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    live: Live,
) -> Result<Option<Task>, Error> {
    let (parts, body) = req.into_parts();
    let target = authority(&parts)?;
    check_websocket_scheme(&parts)?;
    let (host, port) = host_port(Some(&target), Some(80))?;
    let io = &shared.worker.cfg().timeouts;
    let (user, params) = (ex.user.clone(), ex.params.clone());
    let who = (user.as_deref(), params.as_deref());
    let connect = upstream_tcp(shared, who, &host, port, Protocol::Http);
    let Tcp { stream: mut up, addr, via, absolute, early } = unless_reset(respond, connect).await?;
    ex.upstream = Some(addr);
    ex.via = via;
    if !early.is_empty() {
        return Err(Error::UpstreamClosed("with bytes before the request: not a WebSocket origin"));
    }
    let mut out = Vec::with_capacity(1024);
    let to_parent = absolute.as_ref().map(|a| a.as_deref());
    write_head(shared, &parts, &target, "GET", Framing::None, to_parent, &mut out);
    // write_head ended the head; the upgrade fields go before its final CRLF.
    out.truncate(out.len() - 2);
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD.encode(super::nonce());
    let _ = write!(
        out,
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n\r\n"
    );
    write_timed(&mut up, &out, io.io).await?;
    let mut ubuf = shared.worker.take_buf();
    let mut rhead = ResponseHead::new();
    // A reset of the stream ends the wait for the origin's answer, as for a request.
    let mut reset = Reset(respond);
    let reset = Some(std::pin::Pin::new(&mut reset));
    let (worker, ubuf_, rhead_) = (&shared.worker, &mut ubuf, &mut rhead);
    let head =
        read_response_head_or(worker, &mut up, ubuf_, rhead_, Method::Get, io.io, reset).await;
    let result = head.and_then(|()| {
        let upgraded =
            rhead.upgrade.is_some_and(|u| u.get(ubuf.filled()).eq_ignore_ascii_case(b"websocket"));
        if rhead.status != 101 {
            // The origin declined: its answer is the stream's answer, without the body
            // (a WebSocket client has no use for it).
            let mut resp = response(&rhead, ubuf.filled(), None)?;
            resp.headers_mut().remove(http::header::CONTENT_LENGTH);
            return Ok(Err(resp));
        }
        if !upgraded || !rhead.conn.upgrade || !accept_matches(&rhead, ubuf.filled(), &key) {
            return Err(Error::BadUpgrade);
        }
        let mut resp = response(&rhead, ubuf.filled(), None)?;
        *resp.status_mut() = StatusCode::OK;
        resp.headers_mut().remove("sec-websocket-accept");
        ubuf.consume(rhead.len);
        Ok(Ok((resp, ubuf.filled().to_vec())))
    });
    shared.worker.give_buf(ubuf);
    match result? {
        Err(declined) => {
            ex.status = declined.status().as_u16();
            let _ = respond.send_response(declined, true);
            Ok(None)
        }
        Ok((resp, early)) => {
            let send = respond.send_response(resp, false).map_err(client_error)?;
            ex.status = 200;
            let mut relay = Tunnel::new(body, send, up, io.tunnel_idle, io.io)
                .throttled(&shared.throttle(user.as_deref()))
                .counting(shared.traffic_of(user.as_deref()));
            relay.send_early(&early)?;
            Ok(Some(Task::new(relay, ex.take(), live)))
        }
    }
}

/// Whether the origin's 101 proves it read our Sec-WebSocket-Key (RFC 6455 4.1): the
/// proxy is the WebSocket client towards the origin, so the check is the proxy's to make.
fn accept_matches(rhead: &ResponseHead, buf: &[u8], key: &str) -> bool {
    use base64::Engine as _;
    use sha1::Digest as _;
    const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    let digest = sha1::Sha1::new().chain_update(key.as_bytes()).chain_update(GUID).finalize();
    let expected = base64::engine::general_purpose::STANDARD.encode(digest);
    let mut accepts = rhead
        .headers
        .iter()
        .filter(|h| h.name.get(buf).eq_ignore_ascii_case(b"sec-websocket-accept"));
    matches!((accepts.next(), accepts.next()),
        (Some(h), None) if h.value.get(buf).trim_ascii() == expected.as_bytes())
}

/// Only `http` requests are proxied as requests (`https` ones are handled by `forward`).
fn check_scheme(parts: &Parts) -> Result<(), Error> {
    match parts.uri.scheme_str() {
        Some("http") => Ok(()),
        Some("https") => Err(Error::Unsupported(
            "https:// URLs must go through a CONNECT tunnel, not as a plain proxy request",
        )),
        Some("ws" | "wss") => Err(Error::Unsupported(
            "ws:// and wss:// are only for a websocket upgrade (extended CONNECT with \
             :protocol websocket)",
        )),
        _ => Err(Error::Unsupported("only http:// requests can be proxied (or CONNECT host:port)")),
    }
}

/// A WebSocket stream's `:scheme` (RFC 8441 5: `http` for ws://, `https` for wss://; `ws`
/// is taken as `http`, as HTTP/1.1 takes ws:// targets). The stream relay speaks to plain
/// sockets only, so a WebSocket over TLS to the origin is refused, saying so.
fn check_websocket_scheme(parts: &Parts) -> Result<(), Error> {
    match parts.uri.scheme_str() {
        Some("http" | "ws") => Ok(()),
        Some("https" | "wss") => Err(Error::Unsupported(
            "a websocket to a TLS origin (wss://, :scheme https) cannot be relayed over \
             HTTP/2; ask over HTTP/1.1 with a wss:// target",
        )),
        _ => Err(Error::Unsupported("a websocket stream needs :scheme http or https")),
    }
}

/// The request's `content-length`: all its values must be the same number.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    let mut found = None;
    for v in headers.get_all(http::header::CONTENT_LENGTH) {
        let n = std::str::from_utf8(v.as_bytes())
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(Error::Unsupported("invalid content-length"))?;
        if found.is_some_and(|f| f != n) {
            return Err(Error::Unsupported("conflicting content-length values"));
        }
        found = Some(n);
    }
    Ok(found)
}

/// The HTTP/1.1 request head for the origin (`rustle_proto::http::write_h2_request`):
/// Via and X-Forwarded-For/Forwarded as `[http]` says; to a parent proxy, the absolute
/// form and the parent's credentials (`to_parent`).
fn write_head(
    shared: &Shared,
    parts: &Parts,
    authority: &http::uri::Authority,
    method: &str,
    framing: Framing,
    to_parent: Option<Option<&[u8]>>,
    out: &mut Vec<u8>,
) {
    let cfg = &shared.worker.cfg().http;
    let peer_text;
    let rw = RequestRewrite {
        via: cfg.via.then_some(VIA),
        forwarded_for: if cfg.forwarded_for {
            peer_text = shared.peer.ip().to_string();
            Some(peer_text.as_str())
        } else {
            None
        },
        upgrade: false,
        absolute: to_parent.is_some(),
        proxy_authorization: to_parent.flatten(),
    };
    let req = H2Request {
        method: method.as_bytes(),
        authority: authority.as_str().as_bytes(),
        path: parts.uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes(),
    };
    let body = match framing {
        Framing::None => BodyKind::None,
        Framing::Length(n) => BodyKind::Length(n),
        Framing::Chunked => BodyKind::Chunked,
    };
    let fields = || parts.headers.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
    write_h2_request(&req, fields, &rw, body, out);
}

/// The pool key of an origin, as HTTP/1.1 makes it, formatted into `buf` when it fits.
fn pool_key<'a>(
    buf: &'a mut [u8; 320],
    https: bool,
    host: &str,
    port: u16,
) -> std::borrow::Cow<'a, [u8]> {
    let scheme = if https { "https://" } else { "" };
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    match write!(cursor, "{scheme}{host}:{port}") {
        Ok(()) => {
            let n = cursor.position() as usize;
            std::borrow::Cow::Borrowed(&buf[..n])
        }
        Err(_) => std::borrow::Cow::Owned(format!("{scheme}{host}:{port}").into_bytes()),
    }
}

/// The client's body to the origin, framed as decided; each DATA frame's window is given
/// back once the origin took it.
async fn send_body<W: AsyncWrite + Unpin>(
    body: &mut RecvStream,
    first: Option<Bytes>,
    w: &mut W,
    framing: Framing,
    io: Duration,
    sent: &std::cell::Cell<u64>,
    limit: Option<&Limit>,
) -> Result<u64, Error> {
    let mut total = 0u64;
    let mut next = first;
    let mut out = Vec::new();
    loop {
        let data = match next.take() {
            Some(d) => d,
            None => match body::timed(body.data(), io).await {
                None => return Err(Error::Timeout(Phase::ClientBody)),
                Some(None) => break,
                Some(Some(Ok(d))) => d,
                Some(Some(Err(e))) => return Err(client_error(e)),
            },
        };
        if data.is_empty() {
            continue;
        }
        if framing == Framing::Chunked {
            out.clear();
            let _ = write!(out, "{:x}\r\n", data.len());
            out.extend_from_slice(&data);
            out.extend_from_slice(b"\r\n");
            write_timed(w, &out, io).await?;
        } else {
            write_timed(w, &data, io).await?;
        }
        let _ = body.flow_control().release_capacity(data.len());
        total += data.len() as u64;
        sent.set(total);
        pace(limit, data.len()).await;
        if framing == Framing::Length(total) {
            // All of it: h2 resets the stream if more comes, so the exchange need not
            // wait for END_STREAM (which may trail the response).
            return Ok(total);
        }
    }
    if framing == Framing::Chunked {
        out.clear();
        out.extend_from_slice(b"0\r\n");
        let trailers = match body::timed(body.trailers(), io).await {
            None => return Err(Error::Timeout(Phase::ClientBody)),
            Some(r) => r.map_err(client_error)?,
        };
        for (name, value) in trailers.iter().flatten() {
            if is_h2_trailer_kept(name.as_str().as_bytes()) {
                for part in [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
                    out.extend_from_slice(part);
                }
            }
        }
        out.extend_from_slice(b"\r\n");
        write_timed(w, &out, io).await?;
    }
    Ok(total)
}

/// Counts `n` body bytes against a bandwidth limit and, when that put its buckets in
/// debt, waits until they are paid off: a body moves at the limit's rate on average, in
/// bursts of at most one read.
async fn pace(limit: Option<&Limit>, n: usize) {
    let Some(limit) = limit else { return };
    let now = std::time::Instant::now();
    limit.charge(n, now);
    let wait = limit.wait(1, now);
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

/// The origin's body to the client without its HTTP/1.1 framing, as the client's window
/// allows. Returns the body bytes sent.
async fn send_response_body<R: AsyncRead + Unpin>(
    r: &mut R,
    ubuf: &mut Buf,
    send: &mut SendStream<Bytes>,
    state: &mut State,
    io: Duration,
    limit: Option<&Limit>,
) -> Result<u64, Error> {
    let mut total = 0u64;
    // Chunked framing read since the last data: at the end it holds the last chunk and
    // the trailer section, which go to the client as HTTP/2 trailers.
    let mut tail = Vec::new();
    let chunked = matches!(state, State::Dechunk(_));
    loop {
        if state.is_done() {
            return Ok(total);
        }
        if !ubuf.is_empty() {
            let (n, forward) = state.advance(ubuf.filled(), Dir::Down)?;
            if n > 0 {
                if forward {
                    tail.clear();
                    let data = Bytes::copy_from_slice(&ubuf.filled()[..n]);
                    total += n as u64;
                    ubuf.consume(n);
                    send_all(send, data, state.is_done(), io).await?;
                    pace(limit, n).await;
                } else {
                    if chunked && tail.len() < TRAILERS_MAX {
                        tail.extend_from_slice(&ubuf.filled()[..n]);
                    }
                    ubuf.consume(n);
                    if state.is_done() {
                        match trailers(&tail) {
                            Some(map) => send.send_trailers(map).map_err(client_error)?,
                            None => send_all(send, Bytes::new(), true, io).await?,
                        }
                    }
                }
                continue;
            }
        }
        // While the origin is silent, a reset of the stream (or the end of its connection)
        // ends the wait: an origin that streams slowly is not held for a client that left.
        let read = body::timed(ubuf.read_from(r, crate::io::buf::READ_SIZE), io);
        let n = match unless_stream_reset(send, read).await? {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(Error::Upstream(e)),
            None => return Err(Error::Timeout(Phase::UpstreamBody)),
        };
        if n == 0 {
            if matches!(state, State::UntilClose) {
                *state = State::Done;
                send_all(send, Bytes::new(), true, io).await?;
                return Ok(total);
            }
            return Err(Error::UpstreamClosed("in the middle of the response body"));
        }
    }
}

/// Runs `fut` (a read from the origin while the response body streams) unless the client
/// resets the stream or its connection ends first; the reset is looked at only when `fut`
/// has to wait.
async fn unless_stream_reset<T>(
    send: &mut SendStream<Bytes>,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, Error> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        std::task::Poll::Ready(r) => std::task::Poll::Ready(Ok(r)),
        std::task::Poll::Pending => {
            send.poll_reset(cx).map(|_| Err(Error::ClientLeft(Phase::UpstreamBody)))
        }
    })
    .await
}

/// Trailer sections larger than this are dropped (the chunked scanner bounds them too).
const TRAILERS_MAX: usize = 16 * 1024;

/// The trailer fields at the end of a chunked body, from the framing after its last data:
/// `CRLF`, the last chunk (`0[;ext]CRLF`), then fields up to an empty line. `None` when
/// there are none worth sending (fields that must not be trailers are left out, as
/// `is_dropped_trailer` says).
fn trailers(tail: &[u8]) -> Option<HeaderMap> {
    let mut rest = tail;
    // Skip to just after the last-chunk line.
    loop {
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        let line = &rest[..end];
        rest = &rest[end + 2..];
        let size = line.split(|&b| b == b';').next().unwrap_or_default();
        if !size.is_empty() && size.iter().all(|&b| b == b'0') {
            break;
        }
    }
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let httparse::Status::Complete((_, fields)) =
        httparse::parse_headers(rest, &mut fields).ok()?
    else {
        return None;
    };
    let mut map = HeaderMap::new();
    for f in fields.iter() {
        let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(f.name.as_bytes()), HeaderValue::from_bytes(f.value))
        else {
            continue;
        };
        if is_h2_trailer_kept(name.as_str().as_bytes()) {
            map.append(name, value);
        }
    }
    (!map.is_empty()).then_some(map)
}

/// An HTTP/2 response from an HTTP/1.1 head: its fields as
/// `rustle_proto::http::h2_response_fields` gives them (no hop-by-hop ones, one
/// Content-Length), Via added when asked.
fn response(rhead: &ResponseHead, buf: &[u8], via: Option<&str>) -> Result<Response<()>, Error> {
    let mut resp = Response::new(());
    *resp.status_mut() = StatusCode::from_u16(rhead.status)
        .map_err(|_| Error::BadResponse(rustle_proto::http::HeadError::MalformedStartLine))?;
    // Each value is its own small copy: h2's HPACK table keeps the values it indexes for
    // the connection's life, and a slice of one shared copy of the head would keep the
    // whole head alive with it.
    let headers = resp.headers_mut();
    headers.reserve(rhead.headers.len());
    // Holds the Via value when one is added (the only allocation here besides the map's).
    let mut scratch = Vec::new();
    for (name, value) in h2_response_fields(rhead, buf, via, &mut scratch) {
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            continue;
        };
        headers.append(name, value);
    }
    Ok(resp)
}

/// `"NAME"` of the last parent this stream went through.
fn last_parent(ex: &Exchange) -> Box<str> {
    let parent = ex.via.as_deref().and_then(|v| v.parents.rsplit(',').next()).unwrap_or_default();
    format!("\"{parent}\"").into()
}

/// HTTP/2's side of `exchange::send`: the stream watched for a reset, and a new
/// connection to the request's target.
struct Again<'a> {
    shared: &'a Rc<Shared>,
    respond: &'a mut SendResponse<Bytes>,
    who: super::Who<'a>,
    host: &'a str,
    port: u16,
    tls: Tls<'a>,
}

impl Requester for Again<'_> {
    fn left(&mut self) -> impl std::future::Future<Output = Error> + '_ {
        Reset(self.respond)
    }

    fn reconnect(&mut self) -> impl std::future::Future<Output = Result<Connected, Error>> + '_ {
        let Again { shared, respond, who, host, port, tls } = self;
        let connect = upstream(shared, *who, None, host, *port, HTTP, *tls);
        // Boxed: a rare path, and an attempt's state is large.
        Box::pin(unless_reset(respond, connect))
    }
}
