//! The HTTP/1.1 origin's connection loop and request-head parsing, generic
//! over the transport so the plain (`origin`) and TLS (`tls`) servers share
//! every byte of it. Route handlers live in `routes`.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::{Body, Conn};
use crate::fixture::log;
use crate::routes::{self, Route};

/// Counters shared between a server and its handle.
#[derive(Default)]
pub(crate) struct HttpStats {
    pub(crate) requests: AtomicU64,
    pub(crate) connections: AtomicU64,
    /// Connections accepted whose serve task has not ended yet (see `Open`).
    pub(crate) open: AtomicU64,
    pub(crate) ws_messages: AtomicU64,
    /// Reused in place (clear + extend), so steady state does not allocate.
    pub(crate) last_head: Mutex<Vec<u8>>,
}

impl HttpStats {
    pub(crate) fn last_head(&self) -> Vec<u8> {
        // A poisoned lock only means a handler panicked mid-copy; the bytes
        // are still the best information we have.
        self.last_head.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts a connection as open until the returned guard drops. Taken at
    /// accept and moved into the connection's task, so the count goes down
    /// however the task ends: EOF, close, an I/O error, a panic, or the
    /// runtime dropping the task when the fixture stops.
    pub(crate) fn open(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Ordering::Relaxed);
        Open(Arc::clone(self))
    }
}

/// One open connection in `HttpStats::open`; see `HttpStats::open`.
pub(crate) struct Open(Arc<HttpStats>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Head,
    Post,
    Put,
    Other,
}

/// What the handlers need from a parsed head, owned so the read buffer can
/// be reused while the request is being answered.
pub(crate) struct Request {
    pub(crate) method: Method,
    pub(crate) route: Route,
    pub(crate) body: Body,
    /// The body length when it came with Content-Length (echo mirrors it).
    pub(crate) content_length: Option<u64>,
    pub(crate) expect_continue: bool,
    /// Client wants the connection closed after this exchange.
    pub(crate) close: bool,
    pub(crate) upgrade_websocket: bool,
    pub(crate) websocket_key: Option<Vec<u8>>,
}

/// Serves HTTP/1.1 requests on one connection until EOF, error or close.
pub(crate) async fn serve<S>(io: S, stats: Arc<HttpStats>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut conn = Conn::new(io);
    let mut head = Vec::with_capacity(1024);
    if let Err(e) = serve_loop(&mut conn, &stats, &mut head).await {
        log!("connection ended with error: {e}");
    }
}

async fn serve_loop<S>(conn: &mut Conn<S>, stats: &HttpStats, head: &mut Vec<u8>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let req = match read_head(conn, head).await? {
            Parsed::Request(req) => req,
            Parsed::Eof => return Ok(()),
            Parsed::Reject(status) => {
                routes::reject(conn, status).await;
                return Ok(());
            }
        };
        // Count and record before answering: a client that has just read its
        // response must already see its request reflected in the counters.
        {
            let mut last = stats.last_head.lock().unwrap_or_else(|e| e.into_inner());
            last.clear();
            last.extend_from_slice(head);
        }
        stats.requests.fetch_add(1, Ordering::Relaxed);
        match routes::handle(conn, stats, req, head).await? {
            Next::KeepAlive => {
                // Leave pipelined responses queued while more requests are
                // already buffered; `fill` flushes before it would block.
                if conn.pos == conn.end || conn.out.len() >= crate::conn::FLUSH_AT {
                    conn.flush().await?;
                }
            }
            Next::Close => {
                conn.close_gracefully().await;
                return Ok(());
            }
            Next::Done => return Ok(()),
        }
    }
}

/// What to do with the connection after a response.
pub(crate) enum Next {
    KeepAlive,
    /// Flush, half-close and drain, then drop.
    Close,
    /// The handler already finished the connection (e.g. WebSocket).
    Done,
}

enum Parsed {
    Request(Request),
    Eof,
    Reject(u16),
}

const MAX_HEADERS: usize = 64;

async fn read_head<S>(conn: &mut Conn<S>, head: &mut Vec<u8>) -> io::Result<Parsed>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        if conn.pos < conn.end {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut parsed = httparse::Request::new(&mut headers);
            match parsed.parse(conn.buffered()) {
                Ok(httparse::Status::Complete(n)) => {
                    let req = match build_request(&parsed) {
                        Ok(req) => req,
                        Err(status) => return Ok(Parsed::Reject(status)),
                    };
                    head.clear();
                    head.extend_from_slice(&conn.buf[conn.pos..conn.pos + n]);
                    conn.pos += n;
                    return Ok(Parsed::Request(req));
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => return Ok(Parsed::Reject(431)),
                Err(_) => return Ok(Parsed::Reject(400)),
            }
        }
        match conn.fill().await {
            Ok(0) if conn.pos == conn.end => return Ok(Parsed::Eof),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            // Head larger than the buffer cap.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(Parsed::Reject(431)),
            Err(e) => return Err(e),
        }
    }
}

fn build_request(p: &httparse::Request<'_, '_>) -> Result<Request, u16> {
    let method = match p.method.unwrap_or("") {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        _ => Method::Other,
    };
    let http10 = p.version == Some(0);
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut has_te = false;
    let mut expect_continue = false;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut upgrade_websocket = false;
    let mut websocket_key = None;
    for h in p.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let v = parse_decimal(h.value).ok_or(400u16)?;
            if content_length.is_some_and(|old| old != v) {
                return Err(400);
            }
            content_length = Some(v);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            has_te = true;
            // Chunked must be the final coding for a request body to be framed.
            chunked = tokens(h.value).last().is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case("expect") {
            expect_continue = h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case("connection") {
            for t in tokens(h.value) {
                conn_close |= t.eq_ignore_ascii_case(b"close");
                conn_keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade_websocket = tokens(h.value).any(|t| t.eq_ignore_ascii_case(b"websocket"));
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            websocket_key = Some(h.value.trim_ascii().to_vec());
        }
    }
    // Ambiguous framing is a smuggling vector; a test origin should be strict.
    if has_te && (content_length.is_some() || !chunked) {
        return Err(400);
    }
    let body = if chunked { Body::ChunkSize } else { Body::Length(content_length.unwrap_or(0)) };
    Ok(Request {
        method,
        route: routes::route(p.path.unwrap_or("/")),
        body,
        content_length: if chunked { None } else { content_length },
        expect_continue,
        close: conn_close || (http10 && !conn_keep_alive),
        upgrade_websocket,
        websocket_key,
    })
}

/// Comma-separated header tokens, trimmed.
fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',').map(<[u8]>::trim_ascii).filter(|t| !t.is_empty())
}

pub(crate) fn parse_decimal(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}
