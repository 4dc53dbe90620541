//! Streaming message bodies from one socket to another without holding them whole: the
//! framing (length, chunked, until close) decides where a body ends, and the bytes are
//! forwarded as received, but for the trailer fields that must not be forwarded (and
//! the chunked framing, for a client that cannot read it).

use std::io;
use std::time::Duration;

use rustle_proto::chunked::{Progress, Scanner};
use rustle_proto::http::BodyKind;
use std::future::Future;

use tokio::io::AsyncRead;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Phase};
use crate::io::buf::Buf;
use crate::io::conn::Splice;
use crate::io::relay::{splice_body, SpliceFailure};
use crate::limits::{Limit, UserTraffic};

/// Where an exchange counts its body bytes as they move: its own (up, down), kept when a
/// copy ends early, for the access log; and with a user, the user's shared counters too
/// (one relaxed add per write), so that a long body counts towards its quota while it
/// moves (`exchange::end` then leaves them out).
pub(crate) struct Tally<'a> {
    pub(crate) moved: &'a [std::cell::Cell<u64>; 2],
    pub(crate) user: Option<&'a UserTraffic>,
}

impl Tally<'_> {
    #[inline]
    pub(crate) fn add(&self, dir: Dir, n: u64) {
        if n == 0 {
            return;
        }
        let moved = &self.moved[dir as usize];
        moved.set(moved.get() + n);
        if let Some(user) = self.user {
            let dir = match dir {
                Dir::Up => crate::limits::Direction::Up,
                Dir::Down => crate::limits::Direction::Down,
            };
            user.add(dir, n);
        }
    }
}

/// A body of known length is spliced while at least this much of it remains: below it,
/// the copy through the read buffer costs less than the pipe round trip.
pub(crate) const SPLICE_MIN: u64 = 16 * 1024;

/// Which way a body flows; it decides whose fault a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Request body, client to upstream.
    Up,
    /// Response body, upstream to client.
    Down,
}

impl Dir {
    fn read_error(self, e: io::Error) -> Error {
        match self {
            Dir::Up => Error::Client(e),
            Dir::Down => Error::Upstream(e),
        }
    }

    fn write_error(self, e: io::Error) -> Error {
        match self {
            Dir::Up => Error::Upstream(e),
            Dir::Down => Error::Client(e),
        }
    }

    fn truncated(self) -> Error {
        match self {
            Dir::Up => Error::ClientTruncated,
            Dir::Down => Error::UpstreamClosed("in the middle of the response body"),
        }
    }

    fn read_timeout(self) -> Error {
        match self {
            Dir::Up => Error::Timeout(Phase::ClientBody),
            Dir::Down => Error::Timeout(Phase::UpstreamBody),
        }
    }

    fn write_timeout(self) -> Error {
        match self {
            Dir::Up => Error::Timeout(Phase::UpstreamHead),
            Dir::Down => Error::Timeout(Phase::ClientWrite),
        }
    }

    fn framing_error(self, e: rustle_proto::chunked::ChunkError) -> Error {
        match self {
            Dir::Up => Error::BadRequestBody(e),
            Dir::Down => Error::BadResponseBody(e),
        }
    }
}

/// Where a body is in its framing.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Done,
    Remaining(u64),
    Chunked(Scanner),
    /// Chunked on the wire, forwarded without its framing (to an HTTP/1.0 client, which
    /// cannot read chunked; the body then ends with the connection): a scanner made by
    /// `Scanner::dechunk`.
    Dechunk(Scanner),
    /// Until the sender closes (responses only).
    UntilClose,
}

impl State {
    pub(crate) fn new(kind: BodyKind) -> Self {
        match kind {
            BodyKind::None | BodyKind::Length(0) => State::Done,
            BodyKind::Length(n) => State::Remaining(n),
            BodyKind::Chunked => State::Chunked(Scanner::new()),
            BodyKind::CloseDelimited => State::UntilClose,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self, State::Done)
    }

    /// How many of `avail` belong to the body, advancing the framing past them, and
    /// whether those bytes are to be forwarded (the chunked scanner leaves some out).
    /// Fewer than `avail.len()` when the scanner's run ends early: the caller calls
    /// again with the rest, and after 0 reads more first.
    pub(crate) fn advance(&mut self, avail: &[u8], dir: Dir) -> Result<(usize, bool), Error> {
        match self {
            State::Done => Ok((0, true)),
            State::Remaining(n) => {
                let take = (*n).min(avail.len() as u64);
                *n -= take;
                if *n == 0 {
                    *self = State::Done;
                }
                // take <= avail.len(), so it fits in usize.
                Ok((take as usize, true))
            }
            State::Chunked(scanner) | State::Dechunk(scanner) => {
                let run = scanner.scan(avail).map_err(|e| dir.framing_error(e))?;
                if run.progress == Progress::Done {
                    *self = State::Done;
                }
                Ok((run.len, run.forward))
            }
            State::UntilClose => Ok((avail.len(), true)),
        }
    }
}

/// Moves body bytes already read into `buf` onto `out` (heading for the same socket as
/// a head just written there) while `out` stays under `limit`, so a small message goes
/// out in one write.
pub(crate) fn coalesce(
    buf: &mut Buf,
    state: &mut State,
    out: &mut Vec<u8>,
    limit: usize,
    dir: Dir,
) -> Result<u64, Error> {
    if buf.is_empty() || state.is_done() || out.len() >= limit {
        return Ok(0);
    }
    let mut total = 0;
    while !buf.is_empty() && !state.is_done() && out.len() < limit {
        let room = limit - out.len();
        let avail = &buf.filled()[..buf.len().min(room)];
        let (n, forward) = state.advance(avail, dir)?;
        if n == 0 {
            break;
        }
        if forward {
            out.extend_from_slice(&avail[..n]);
            total += n as u64;
        }
        buf.consume(n);
    }
    Ok(total)
}

/// Copies the rest of a body: first what is in `buf`, then from `r`, counting each write
/// on `tally`. On success the body is complete; bytes after it stay in `buf`.
///
/// With `splice` set, a body of known length moves kernel-side through a pipe while at
/// least `SPLICE_MIN` bytes of it remain and none are buffered.
// The framing state, both sockets, the buffer and the two policies (splice, bandwidth)
// are all distinct inputs; bundling them would only move the list elsewhere.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn copy<R, W>(
    r: &mut R,
    buf: &mut Buf,
    w: &mut W,
    state: &mut State,
    dir: Dir,
    idle: Duration,
    splice: bool,
    limit: Option<&Limit>,
    tally: &Tally<'_>,
) -> Result<(), Error>
where
    R: AsyncRead + Splice + Unpin,
    W: AsyncWrite + Splice + Unpin,
{
    // A limited body is copied (not spliced), so that every byte is counted.
    let splice = splice && limit.is_none();
    if splice && matches!(state, State::Remaining(n) if *n >= SPLICE_MIN) {
        w.prepare_splice();
    }
    loop {
        if state.is_done() {
            return Ok(());
        }
        if let (true, State::Remaining(n), Some(src), Some(dst)) =
            (splice, &mut *state, r.tcp(), w.tcp())
        {
            if buf.is_empty() && *n >= SPLICE_MIN {
                match splice_body(src, dst, *n, idle).await {
                    Err(SpliceFailure::SrcStalled) => return Err(dir.read_timeout()),
                    // The destination not taking what was read is the destination's fault.
                    Err(SpliceFailure::DstStalled) => return Err(dir.write_timeout()),
                    // No pipe to be had: copy this round instead.
                    Ok(None) => {}
                    Ok(Some(0)) => return Err(dir.truncated()),
                    Ok(Some(k)) => {
                        *n -= k as u64;
                        tally.add(dir, k as u64);
                        if *n == 0 {
                            *state = State::Done;
                        }
                        continue;
                    }
                    Err(SpliceFailure::Src(e)) => return Err(dir.read_error(e)),
                    Err(SpliceFailure::Dst(e)) => return Err(dir.write_error(e)),
                }
            }
        }
        if !buf.is_empty() {
            let (n, forward) = state.advance(buf.filled(), dir)?;
            if n > 0 {
                if forward {
                    match write_all_timed(w, &buf.filled()[..n], idle).await {
                        Ok(()) => {}
                        Err(None) => return Err(dir.write_timeout()),
                        Err(Some(e)) => return Err(dir.write_error(e)),
                    }
                    tally.add(dir, n as u64);
                    if let Some(limit) = limit {
                        // Count what moved, then wait off any debt before reading more.
                        let now = std::time::Instant::now();
                        limit.charge(n, now);
                        let pause = limit.wait(crate::io::relay::SCRATCH, now);
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                }
                buf.consume(n);
                continue;
            }
            if state.is_done() {
                return Ok(());
            }
        }
        let n = match timed(buf.read_from(r, crate::io::buf::READ_SIZE), idle).await {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(dir.read_error(e)),
            None => return Err(dir.read_timeout()),
        };
        if n == 0 {
            if matches!(state, State::UntilClose) {
                *state = State::Done;
                return Ok(());
            }
            return Err(dir.truncated());
        }
    }
}

/// Runs `fut` within `idle`. Most socket operations on a busy connection complete at
/// once, so the first poll happens without arming a timer; only an operation that has to
/// wait gets one. `None` is the timeout.
pub(crate) async fn timed<F: Future>(fut: F, idle: Duration) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    match crate::io::idle::poll_once(fut.as_mut()).await {
        Some(r) => Some(r),
        None => tokio::time::timeout(idle, fut).await.ok(),
    }
}

/// Writes and flushes everything within `idle` (see `timed`). `Err(None)` is the
/// timeout. The flush is what makes a TLS stream send what it encrypted; on TCP it is free.
pub(crate) async fn write_all_timed<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    idle: Duration,
) -> Result<(), Option<io::Error>> {
    let write = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    match timed(write, idle).await {
        Some(r) => r.map_err(Some),
        None => Err(None),
    }
}
