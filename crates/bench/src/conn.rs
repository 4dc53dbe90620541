//! Buffered connection state shared by the HTTP and WebSocket handlers:
//! one reusable read buffer, one reusable output buffer, and a request-body
//! decoder (Content-Length or chunked) that hands out slices of the read
//! buffer without copying.
//!
//! Invariant: `fill` flushes pending output before it blocks on a read, so
//! a handler can queue bytes freely without ever deadlocking a client that
//! waits for a response before sending more (e.g. `Expect: 100-continue`).

use std::io;
use std::ops::Range;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const INITIAL_BUF: usize = 16 * 1024;
/// Heads, chunk-size lines and frame headers must fit in this much.
const MAX_BUF: usize = 1024 * 1024;
/// Queued output beyond this is written out instead of grown further.
pub(crate) const FLUSH_AT: usize = 64 * 1024;

/// Where a request body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailers,
    Done,
}

pub(crate) struct Conn<S> {
    pub(crate) io: S,
    pub(crate) buf: Vec<u8>,
    pub(crate) pos: usize,
    pub(crate) end: usize,
    pub(crate) out: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub(crate) fn new(io: S) -> Self {
        Conn {
            io,
            buf: vec![0; INITIAL_BUF],
            pos: 0,
            end: 0,
            out: Vec::with_capacity(FLUSH_AT + 1024),
        }
    }

    /// Bytes read but not consumed yet.
    pub(crate) fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    /// Flushes queued output, then reads more input. Returns 0 at EOF.
    pub(crate) async fn fill(&mut self) -> io::Result<usize> {
        self.flush().await?;
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.pos > 0 {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            } else if self.buf.len() < MAX_BUF {
                let len = self.buf.len() * 2;
                self.buf.resize(len, 0);
            } else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unterminated head or line exceeds buffer",
                ));
            }
        }
        let n = self.io.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n)
    }

    /// Like `fill`, but EOF is an error (we were in the middle of something).
    pub(crate) async fn fill_more(&mut self) -> io::Result<()> {
        if self.fill().await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    /// Ensures at least `n` unconsumed bytes are buffered.
    pub(crate) async fn need(&mut self, n: usize) -> io::Result<()> {
        while self.end - self.pos < n {
            self.fill_more().await?;
        }
        Ok(())
    }

    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.io.write_all(&self.out).await?;
            self.out.clear();
        }
        // A no-op on TCP; over TLS (TlsOrigin) it writes the records a
        // `write_all` left in the session when the socket was full, without
        // which the tail of an answer waits for the next write, forever.
        self.io.flush().await
    }

    /// Queues `data`, writing it through directly when it is large so big
    /// bodies are not copied into `out`.
    pub(crate) async fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if self.out.len() + data.len() <= FLUSH_AT {
            self.out.extend_from_slice(data);
            return Ok(());
        }
        self.flush().await?;
        if data.len() >= FLUSH_AT / 2 {
            self.io.write_all(data).await
        } else {
            self.out.extend_from_slice(data);
            Ok(())
        }
    }

    /// Next piece of the request body as a range of `buf`, valid until the
    /// next call that reads. `None` once the body (and any trailers) is done.
    pub(crate) async fn body_piece(&mut self, body: &mut Body) -> io::Result<Option<Range<usize>>> {
        loop {
            match *body {
                Body::Done => return Ok(None),
                Body::Length(0) => *body = Body::Done,
                Body::Length(left) | Body::ChunkData(left) => {
                    if self.pos == self.end {
                        self.fill_more().await?;
                    }
                    let avail = (self.end - self.pos) as u64;
                    // `take` is at most `avail`, which came from a usize.
                    let take = left.min(avail) as usize;
                    let range = self.pos..self.pos + take;
                    self.pos += take;
                    let rest = left - take as u64;
                    *body = match *body {
                        Body::Length(_) => Body::Length(rest),
                        _ if rest == 0 => Body::ChunkDataEnd,
                        _ => Body::ChunkData(rest),
                    };
                    return Ok(Some(range));
                }
                Body::ChunkSize => match httparse::parse_chunk_size(self.buffered()) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.pos += used;
                        *body = if size == 0 { Body::Trailers } else { Body::ChunkData(size) };
                    }
                    Ok(httparse::Status::Partial) => self.fill_more().await?,
                    Err(_) => return Err(invalid("bad chunk size line")),
                },
                Body::ChunkDataEnd => {
                    self.need(1).await?;
                    if self.buf[self.pos] == b'\n' {
                        self.pos += 1;
                    } else {
                        self.need(2).await?;
                        if &self.buf[self.pos..self.pos + 2] != b"\r\n" {
                            return Err(invalid("chunk data not followed by CRLF"));
                        }
                        self.pos += 2;
                    }
                    *body = Body::ChunkSize;
                }
                Body::Trailers => match self.buffered().iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        let line = &self.buf[self.pos..self.pos + i];
                        let empty = line.is_empty() || line == b"\r";
                        self.pos += i + 1;
                        if empty {
                            *body = Body::Done;
                        }
                    }
                    None => self.fill_more().await?,
                },
            }
        }
    }

    /// Reads and drops the rest of a request body.
    pub(crate) async fn discard_body(&mut self, body: &mut Body) -> io::Result<u64> {
        let mut n = 0;
        while let Some(r) = self.body_piece(body).await? {
            n += r.len() as u64;
        }
        Ok(n)
    }

    /// Flushes, half-closes, then drains input until the peer closes (or a
    /// short timeout) so unread request bytes cannot turn our close into a
    /// RST that would destroy the response still in flight to the client.
    pub(crate) async fn close_gracefully(&mut self) {
        if self.flush().await.is_err() {
            return;
        }
        let _ = self.io.shutdown().await;
        let drain = async {
            loop {
                match self.io.read(&mut self.buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    }
}

pub(crate) fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Appends the decimal form of `v` without going through `fmt`.
pub(crate) fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// Appends the lower-case hex form of `v` (chunk-size lines).
pub(crate) fn put_hex(out: &mut Vec<u8>, mut v: u64) {
    let mut tmp = [0u8; 16];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b"0123456789abcdef"[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}
