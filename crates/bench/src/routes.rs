//! Route table and handlers of the HTTP origin (see the crate docs for the
//! list). Small responses are assembled in the connection's reusable output
//! buffer and leave in one write; large bodies stream from the static
//! pattern block, so `/bytes/N` never allocates N.

use std::io;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::{put_hex, put_u64, Body, Conn, FLUSH_AT};
use crate::http::{parse_decimal, HttpStats, Method, Next, Request};
use crate::pattern::{self, BLOCK_LEN};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Bytes(u64),
    Chunked { len: u64, size: u64 },
    Close(u64),
    Echo,
    Sha256,
    Status(u16),
    Headers,
    Delay(u64),
    Malformed(&'static [u8]),
    Ws,
    BadRequest,
    NotFound,
}

pub(crate) fn route(target: &str) -> Route {
    // Tolerate absolute-form targets so a misbehaving proxy still gets
    // answered (the raw head, via /headers, shows what it actually sent).
    let target = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let n = |s: &str| parse_decimal(s.as_bytes());
    match path {
        "/echo" => return Route::Echo,
        "/sha256" => return Route::Sha256,
        "/headers" => return Route::Headers,
        "/ws" => return Route::Ws,
        _ => {}
    }
    let Some((prefix, arg)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return Route::NotFound;
    };
    let parsed = match prefix {
        "bytes" => n(arg).map(Route::Bytes),
        "close" => n(arg).map(Route::Close),
        "delay" => n(arg).map(Route::Delay),
        "status" => n(arg).filter(|s| (200..=599).contains(s)).map(|s| Route::Status(s as u16)),
        "chunked" => {
            let size = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("size="))
                .map_or(Some(4096), n)
                .filter(|&s| s > 0);
            n(arg).zip(size).map(|(len, size)| Route::Chunked { len, size })
        }
        "malformed" => return malformed_response(arg).map_or(Route::NotFound, Route::Malformed),
        _ => return Route::NotFound,
    };
    parsed.unwrap_or(Route::BadRequest)
}

/// The exact bytes `/malformed/KIND` writes before closing, or `None` for an
/// unknown kind. Public so tests can compare byte for byte.
pub fn malformed_response(kind: &str) -> Option<&'static [u8]> {
    Some(match kind {
        "cl-and-te" => {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        }
        "two-cl" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "bad-chunk" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        "obs-fold" => {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Folded: first\r\n second\r\n\r\nhello"
        }
        "bare-lf" => b"HTTP/1.1 200 OK\nContent-Length: 5\nX-Bare: lf\n\nhello",
        "garbage" => b"NOT HTTP AT ALL\r\n\r\n",
        "truncated" => b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",
        "no-response" => b"",
        _ => return None,
    })
}

pub(crate) async fn handle<S>(
    conn: &mut Conn<S>,
    stats: &HttpStats,
    req: Request,
    head: &[u8],
) -> io::Result<Next>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut body = req.body;
    let head_only = req.method == Method::Head;
    let has_body = body != Body::Length(0);
    if req.expect_continue && has_body {
        conn.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    let writes_body = matches!(req.method, Method::Post | Method::Put);
    match req.route {
        Route::Echo if writes_body => return echo(conn, &req, &mut body).await,
        Route::Sha256 if writes_body => return sha256(conn, &req, &mut body).await,
        _ => {}
    }
    conn.discard_body(&mut body).await?;
    let close = req.close;
    let out = &mut conn.out;
    match req.route {
        Route::Echo | Route::Sha256 => {
            simple(out, 405, b"use POST or PUT\n", &["Allow: POST, PUT"], head_only, close);
        }
        Route::NotFound => simple(out, 404, b"not found\n", &[], head_only, close),
        Route::BadRequest => simple(out, 400, b"bad request\n", &[], head_only, close),
        Route::Headers => simple(out, 200, head, &["Content-Type: text/plain"], head_only, close),
        Route::Status(code) => status(out, code, head_only, close),
        Route::Delay(ms) => {
            conn.flush().await?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            simple(&mut conn.out, 200, b"ok", &[], head_only, close);
        }
        Route::Bytes(n) => {
            start(out, 200);
            content_length(out, n);
            end_head(out, close);
            if !head_only {
                send_pattern(conn, 0, n).await?;
            }
        }
        Route::Close(n) => {
            start(out, 200);
            end_head(out, true);
            if !head_only {
                send_pattern(conn, 0, n).await?;
            }
            return Ok(Next::Close);
        }
        Route::Chunked { len, size } => {
            start(out, 200);
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n");
            end_head(out, close);
            if !head_only {
                send_chunked_pattern(conn, len, size).await?;
            }
        }
        Route::Malformed(bytes) => {
            conn.send(bytes).await?;
            return Ok(Next::Close);
        }
        Route::Ws if req.upgrade_websocket => {
            return crate::ws::upgrade(conn, stats, req.websocket_key.as_deref()).await;
        }
        Route::Ws => simple(
            out,
            426,
            b"websocket upgrade required\n",
            &["Upgrade: websocket"],
            head_only,
            close,
        ),
    }
    Ok(if close { Next::Close } else { Next::KeepAlive })
}

/// Answers an unparseable request and closes.
pub(crate) async fn reject<S>(conn: &mut Conn<S>, code: u16)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    simple(&mut conn.out, code, b"bad request\n", &[], false, true);
    conn.close_gracefully().await;
}

async fn echo<S>(conn: &mut Conn<S>, req: &Request, body: &mut Body) -> io::Result<Next>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    start(&mut conn.out, 200);
    match req.content_length {
        Some(n) => content_length(&mut conn.out, n),
        None => conn.out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
    end_head(&mut conn.out, req.close);
    let chunked = req.content_length.is_none();
    while let Some(r) = conn.body_piece(body).await? {
        // Copying into `out` (rather than writing from `buf` directly) keeps
        // the response bytes in order behind anything already queued.
        if chunked {
            put_hex(&mut conn.out, r.len() as u64);
            conn.out.extend_from_slice(b"\r\n");
        }
        conn.out.extend_from_slice(&conn.buf[r]);
        if chunked {
            conn.out.extend_from_slice(b"\r\n");
        }
        if conn.out.len() >= FLUSH_AT {
            conn.flush().await?;
        }
    }
    if chunked {
        conn.out.extend_from_slice(b"0\r\n\r\n");
    }
    Ok(if req.close { Next::Close } else { Next::KeepAlive })
}

async fn sha256<S>(conn: &mut Conn<S>, req: &Request, body: &mut Body) -> io::Result<Next>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    while let Some(r) = conn.body_piece(body).await? {
        len += r.len() as u64;
        hasher.update(&conn.buf[r]);
    }
    let mut text = pattern::hex(&hasher.finalize()).into_bytes();
    text.push(b' ');
    put_u64(&mut text, len);
    simple(&mut conn.out, 200, &text, &["Content-Type: text/plain"], false, req.close);
    Ok(if req.close { Next::Close } else { Next::KeepAlive })
}

fn status(out: &mut Vec<u8>, code: u16, head_only: bool, close: bool) {
    let location: &[&str] = match code {
        301 | 302 | 303 | 307 | 308 => &["Location: /"],
        _ => &[],
    };
    if code == 204 || code == 304 {
        // No body and no Content-Length: these statuses never carry one.
        start(out, code);
        for h in location {
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        end_head(out, close);
        return;
    }
    let mut body = *b"status 000\n";
    body[7] = b'0' + (code / 100) as u8;
    body[8] = b'0' + (code / 10 % 10) as u8;
    body[9] = b'0' + (code % 10) as u8;
    simple(out, code, &body, location, head_only, close);
}

/// Streams pattern bytes `offset .. offset + n`.
async fn send_pattern<S>(conn: &mut Conn<S>, mut offset: u64, n: u64) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let end = offset + n;
    while offset < end {
        let take = (end - offset).min(BLOCK_LEN as u64) as usize;
        conn.send(pattern::slice_at(offset, take)).await?;
        offset += take as u64;
    }
    Ok(())
}

async fn send_chunked_pattern<S>(conn: &mut Conn<S>, len: u64, size: u64) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut offset = 0;
    while offset < len {
        let take = size.min(len - offset);
        if conn.out.len() + 32 > FLUSH_AT {
            conn.flush().await?;
        }
        put_hex(&mut conn.out, take);
        conn.out.extend_from_slice(b"\r\n");
        send_pattern(conn, offset, take).await?;
        conn.send(b"\r\n").await?;
        offset += take;
    }
    conn.send(b"0\r\nX-Trailer: done\r\n\r\n").await
}

fn reason(code: u16) -> &'static str {
    match code {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        413 => "Content Too Large",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

pub(crate) fn start(out: &mut Vec<u8>, code: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    put_u64(out, u64::from(code));
    out.push(b' ');
    out.extend_from_slice(reason(code).as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn content_length(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"Content-Length: ");
    put_u64(out, n);
    out.extend_from_slice(b"\r\n");
}

fn end_head(out: &mut Vec<u8>, close: bool) {
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A complete response with a Content-Length body.
fn simple(
    out: &mut Vec<u8>,
    code: u16,
    body: &[u8],
    headers: &[&str],
    head_only: bool,
    close: bool,
) {
    start(out, code);
    for h in headers {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    content_length(out, body.len() as u64);
    end_head(out, close);
    if !head_only {
        out.extend_from_slice(body);
    }
}
