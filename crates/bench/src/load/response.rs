//! Strict HTTP/1.1 response reading for the load generator.
//!
//! One [`Reader`] per connection task owns a fixed read buffer that is reused
//! for every response (and every reconnect). Heads are parsed in place with
//! httparse; bodies are skipped by their framing (Content-Length, chunked, or
//! until close) by reading into the same buffer and discarding, so nothing
//! is copied or allocated per response. Anything that does not frame
//! exactly is a [`ErrorKind::Parse`].

use tokio::io::{AsyncRead, AsyncReadExt};

use super::stats::ErrorKind;
use crate::http::parse_decimal;

/// Normal buffer: large reads keep the syscall count per body low.
pub(crate) const BUF_LEN: usize = 64 * 1024;
/// Hold mode keeps thousands of idle connections: keep their buffers small.
pub(crate) const SMALL_BUF_LEN: usize = 8 * 1024;
/// A chunk-size or trailer line longer than this is malformed.
const MAX_LINE: usize = 4096;
/// Headers beyond this many make the head unparseable (a Parse error).
const MAX_HEADERS: usize = 48;

/// What the request was, which decides how a response is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// A GET/POST: framed by its headers.
    Normal,
    /// A CONNECT: a 2xx has no body (the tunnel starts right after the head).
    Tunnel,
    /// A WebSocket upgrade: 101 has no body and must carry this accept key.
    Upgrade(&'static str),
}

/// A complete response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    pub(crate) status: u16,
    /// The connection cannot be reused afterwards.
    pub(crate) close: bool,
    /// Wire bytes of the response (interim 1xx heads included).
    pub(crate) bytes: u64,
}

enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

struct Head {
    status: u16,
    close: bool,
    framing: Framing,
}

pub(crate) struct Reader {
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// Bytes consumed since the current response started.
    consumed: u64,
}

impl Reader {
    pub(crate) fn new(len: usize) -> Reader {
        Reader { buf: vec![0; len].into_boxed_slice(), pos: 0, end: 0, consumed: 0 }
    }

    /// Forgets buffered bytes (on a new connection).
    pub(crate) fn reset(&mut self) {
        self.pos = 0;
        self.end = 0;
    }

    /// Bytes read from the socket but not consumed yet.
    pub(crate) fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    pub(crate) fn advance(&mut self, n: usize) {
        debug_assert!(n <= self.end - self.pos);
        self.pos += n;
        self.consumed += n as u64;
    }

    /// Starts counting bytes for a new response / message.
    pub(crate) fn start(&mut self) {
        self.consumed = 0;
    }

    pub(crate) fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Reads more input after the buffered bytes. Returns 0 at EOF.
    async fn fill<S: AsyncRead + Unpin>(&mut self, io: &mut S) -> Result<usize, ErrorKind> {
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.pos == 0 {
                // A head or line that fills the whole buffer is not sane.
                return Err(ErrorKind::Parse);
            }
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        let n = io.read(&mut self.buf[self.end..]).await.map_err(|_| ErrorKind::Read)?;
        self.end += n;
        Ok(n)
    }

    /// Ensures at least `n` (<= buffer size) bytes are buffered.
    pub(crate) async fn need<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        n: usize,
    ) -> Result<(), ErrorKind> {
        while self.end - self.pos < n {
            if self.fill(io).await? == 0 {
                return Err(ErrorKind::ClosedEarly);
            }
        }
        Ok(())
    }

    /// Discards exactly `n` bytes of input without copying them.
    pub(crate) async fn skip<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        mut n: u64,
    ) -> Result<(), ErrorKind> {
        loop {
            // Bounded by the buffered amount, which is a usize.
            let take = n.min((self.end - self.pos) as u64) as usize;
            self.advance(take);
            n -= take as u64;
            if n == 0 {
                return Ok(());
            }
            if self.fill(io).await? == 0 {
                return Err(ErrorKind::ClosedEarly);
            }
        }
    }

    /// Discards input until EOF.
    async fn skip_to_eof<S: AsyncRead + Unpin>(&mut self, io: &mut S) -> Result<(), ErrorKind> {
        loop {
            self.advance(self.end - self.pos);
            if self.fill(io).await? == 0 {
                return Ok(());
            }
        }
    }

    /// Waits for the peer to close: after a `Connection: close` exchange the
    /// server closes first, so TIME_WAIT lands on its side rather than
    /// exhausting our ephemeral ports. Data instead of EOF is a Parse error.
    pub(crate) async fn expect_eof<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
    ) -> Result<(), ErrorKind> {
        if self.pos != self.end || self.fill(io).await? != 0 {
            return Err(ErrorKind::Parse);
        }
        Ok(())
    }

    /// Reads one complete response to a request of kind `expect`.
    pub(crate) async fn response<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        expect: Expect,
    ) -> Result<Response, ErrorKind> {
        self.start();
        let head = loop {
            let head = self.head(io, expect).await?;
            // Interim responses (100 Continue, 103 Early Hints) precede the real one.
            if !(100..200).contains(&head.status) || head.status == 101 {
                break head;
            }
        };
        match head.framing {
            Framing::Empty => {}
            Framing::Length(n) => self.skip(io, n).await?,
            Framing::Chunked => self.chunked(io).await?,
            Framing::UntilClose => self.skip_to_eof(io).await?,
        }
        Ok(Response { status: head.status, close: head.close, bytes: self.consumed })
    }

    async fn head<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
        expect: Expect,
    ) -> Result<Head, ErrorKind> {
        loop {
            if self.pos < self.end {
                if let Some((len, head)) = parse_head(&self.buf[self.pos..self.end], expect)? {
                    self.advance(len);
                    return Ok(head);
                }
            }
            if self.fill(io).await? == 0 {
                return Err(ErrorKind::ClosedEarly);
            }
        }
    }

    /// Length of the next line including its CRLF (bare LF is malformed).
    async fn line<S: AsyncRead + Unpin>(&mut self, io: &mut S) -> Result<usize, ErrorKind> {
        let mut scanned = 0;
        loop {
            let avail = &self.buf[self.pos..self.end];
            if let Some(i) = avail[scanned..].iter().position(|&b| b == b'\n') {
                let len = scanned + i + 1;
                if len < 2 || avail[len - 2] != b'\r' {
                    return Err(ErrorKind::Parse);
                }
                return Ok(len);
            }
            scanned = avail.len();
            if scanned > MAX_LINE {
                return Err(ErrorKind::Parse);
            }
            // `fill` may move the unread bytes to the buffer start; `scanned`
            // counts from `pos`, so it stays valid either way.
            if self.fill(io).await? == 0 {
                return Err(ErrorKind::ClosedEarly);
            }
        }
    }

    async fn chunked<S: AsyncRead + Unpin>(&mut self, io: &mut S) -> Result<(), ErrorKind> {
        loop {
            let len = self.line(io).await?;
            let size = parse_chunk_size(&self.buf[self.pos..self.pos + len - 2])?;
            self.advance(len);
            if size == 0 {
                // Trailer section: header lines until an empty line.
                loop {
                    let len = self.line(io).await?;
                    self.advance(len);
                    if len == 2 {
                        return Ok(());
                    }
                }
            }
            self.skip(io, size).await?;
            self.need(io, 2).await?;
            if self.buffered()[..2] != *b"\r\n" {
                return Err(ErrorKind::Parse);
            }
            self.advance(2);
        }
    }
}

/// `Ok(None)` when the head is incomplete.
fn parse_head(buf: &[u8], expect: Expect) -> Result<Option<(usize, Head)>, ErrorKind> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(ErrorKind::Parse),
    };
    let status = r.code.ok_or(ErrorKind::Parse)?;
    let http10 = r.version == Some(0);
    let mut close = false;
    let mut keep_alive = false;
    let mut length: Option<u64> = None;
    let mut te: Option<bool> = None;
    let mut accept_ok = false;
    for h in r.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let v = parse_decimal(h.value).ok_or(ErrorKind::Parse)?;
            if length.is_some_and(|old| old != v) {
                return Err(ErrorKind::Parse);
            }
            length = Some(v);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked must be the final coding; a later header line overrides.
            let last =
                h.value.rsplit(|&b| b == b',').map(<[u8]>::trim_ascii).find(|t| !t.is_empty());
            te = Some(last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")));
        } else if name.eq_ignore_ascii_case("connection") {
            for t in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                close |= t.eq_ignore_ascii_case(b"close");
                keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("sec-websocket-accept") {
            if let Expect::Upgrade(key) = expect {
                accept_ok = h.value.trim_ascii() == key.as_bytes();
            }
        }
    }
    let close = close || (http10 && !keep_alive);
    let no_body = status == 204
        || status == 304
        || (100..200).contains(&status)
        || (expect == Expect::Tunnel && (200..300).contains(&status));
    let framing = if no_body {
        Framing::Empty
    } else {
        match (te, length) {
            // Both is ambiguous (a smuggling vector): refuse it.
            (Some(_), Some(_)) => return Err(ErrorKind::Parse),
            (Some(true), None) => Framing::Chunked,
            (Some(false), None) | (None, None) => Framing::UntilClose,
            (None, Some(n)) => Framing::Length(n),
        }
    };
    if status == 101 {
        // Only an upgrade we asked for, with the right key, is acceptable.
        if !matches!(expect, Expect::Upgrade(_)) || !accept_ok {
            return Err(ErrorKind::Parse);
        }
    }
    let close = close || matches!(framing, Framing::UntilClose);
    Ok(Some((len, Head { status, close, framing })))
}

/// Hex chunk size, optionally followed by `;extensions` (or whitespace).
fn parse_chunk_size(line: &[u8]) -> Result<u64, ErrorKind> {
    let digits_end = line.iter().position(|b| !b.is_ascii_hexdigit()).unwrap_or(line.len());
    let (digits, rest) = line.split_at(digits_end);
    if digits.is_empty() || digits.len() > 15 {
        return Err(ErrorKind::Parse);
    }
    let rest = rest.trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(ErrorKind::Parse);
    }
    let mut n = 0u64;
    for d in digits {
        // Checked by is_ascii_hexdigit above.
        n = n * 16 + u64::from((*d as char).to_digit(16).unwrap_or(0));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn read(wire: &[u8], expect: Expect) -> Result<(Response, usize), ErrorKind> {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut io = wire;
            let mut r = Reader::new(128);
            let resp = r.response(&mut io, expect).await?;
            Ok((resp, r.buffered().len() + io.len()))
        })
    }

    #[test]
    fn content_length_and_chunked() {
        let wire = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n";
        let mut full = wire.to_vec();
        full.extend_from_slice(&[7u8; 100]);
        full.extend_from_slice(b"X");
        let (resp, left) = read(&full, Expect::Normal).unwrap();
        assert_eq!((resp.status, resp.close, resp.bytes, left), (200, false, 140, 1));

        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            5;x=y\r\nhello\r\n46\r\n0123456789012345678901234567890123456789012345678901234567890123456789\r\n\
            0\r\nX-Trailer: done\r\n\r\n";
        let (resp, left) = read(chunked, Expect::Normal).unwrap();
        assert_eq!((resp.status, resp.bytes as usize, left), (200, chunked.len(), 0));
    }

    #[test]
    fn bad_framing_is_a_parse_error() {
        let cases: [&[u8]; 6] = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",
            b"HTTQ/1.1 200 OK\r\n\r\n",
        ];
        for c in cases {
            assert_eq!(read(c, Expect::Normal).unwrap_err(), ErrorKind::Parse, "{c:?}");
        }
    }

    #[test]
    fn truncation_is_closed_early() {
        let cases: [&[u8]; 3] = [
            b"",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
        ];
        for c in cases {
            assert_eq!(read(c, Expect::Normal).unwrap_err(), ErrorKind::ClosedEarly, "{c:?}");
        }
    }

    #[test]
    fn special_framings() {
        let (r, left) = read(b"HTTP/1.1 200 OK\r\n\r\nuntil close", Expect::Normal).unwrap();
        assert!(r.close && left == 0 && r.bytes == 30);
        let (r, left) =
            read(b"HTTP/1.1 200 Connection established\r\n\r\nX", Expect::Tunnel).unwrap();
        assert!(!r.close && left == 1);
        let (r, _) =
            read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 204 No\r\n\r\n", Expect::Normal).unwrap();
        assert_eq!((r.status, r.close), (204, true));
        let up = b"HTTP/1.1 101 S\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: abc\r\n\r\n";
        assert_eq!(read(up, Expect::Upgrade("abc")).unwrap().0.status, 101);
        assert_eq!(read(up, Expect::Upgrade("abd")).unwrap_err(), ErrorKind::Parse);
        assert_eq!(read(up, Expect::Normal).unwrap_err(), ErrorKind::Parse);
    }
}
