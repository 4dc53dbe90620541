//! The wrapper around a client connection's byte stream: `Watch` gives back first the
//! bytes HTTP/1.1 read before it saw the HTTP/2 preface (h2c), and reads the frame headers
//! going by to count the frames the h2 crate answers without telling us (PING, SETTINGS,
//! RST_STREAM), so that floods of them can be stopped.
//!
//! It also gathers writes. The h2 crate flushes its encoder whenever a DATA frame of more
//! than 256 bytes is queued behind another, so left alone it gives every small response its
//! own write (and TLS record), even when many are answered in one wakeup.
//! Once the handshake is done, small writes are copied into `Out` and h2's flushes are
//! no-ops; the connection task sends what gathered after each poll of the connection
//! (`Out::poll_send`): one write per wakeup. Large writes with nothing gathered go
//! straight through, so bulk DATA is not copied twice.

use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 3.4).
pub(crate) use rustle_proto::detect::H2_PREFACE as PREFACE;

/// Frame types counted (RFC 9113 6).
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
/// The ACK flag of SETTINGS and PING: acknowledgements answer our own frames.
const ACK: u8 = 0x1;

/// Frame counts of one connection in the current window, and the limits.
pub(super) struct Flood {
    window: Duration,
    max: [u32; 3],
    counts: [Cell<u32>; 3],
    since: Cell<Instant>,
    /// Set when a limit is passed: what happened, for the log line.
    tripped: Cell<Option<&'static str>>,
}

const RESETS: usize = 0;
const PINGS: usize = 1;
const SETTINGS_FRAMES: usize = 2;

impl Flood {
    pub(super) fn new(cfg: &crate::config::Http2) -> Self {
        Flood {
            window: cfg.flood_window,
            max: [cfg.max_resets, cfg.max_pings, cfg.max_settings],
            counts: Default::default(),
            since: Cell::new(Instant::now()),
            tripped: Cell::new(None),
        }
    }

    /// The cause, once a limit was passed.
    pub(super) fn tripped(&self) -> Option<&'static str> {
        self.tripped.get()
    }

    /// Counts one frame; true when it is past its limit.
    fn count(&self, which: usize) -> bool {
        let now = Instant::now();
        if now.duration_since(self.since.get()) >= self.window {
            self.since.set(now);
            for c in &self.counts {
                c.set(0);
            }
        }
        let n = self.counts[which].get().saturating_add(1);
        self.counts[which].set(n);
        let over = n > self.max[which];
        if over && self.tripped.get().is_none() {
            self.tripped.set(Some(match which {
                RESETS => "rapid reset: too many RST_STREAM frames",
                PINGS => "PING flood: too many PING frames",
                _ => "SETTINGS flood: too many SETTINGS frames",
            }));
        }
        over
    }
}

/// Most bytes gathered before writes go to the stream inside `poll_write`.
const GATHER_MAX: usize = 64 * 1024;
/// A write at least this large, with nothing gathered, goes straight through.
const DIRECT: usize = 16 * 1024;

/// The client stream's write side, shared by `Watch` (inside h2) and the connection task
/// (which sends what gathered).
pub(super) struct Out<IO> {
    io: IO,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    off: usize,
    /// Whether writes are gathered (after the handshake) or go straight through.
    gather: bool,
    /// Written to `io` since its last flush.
    dirty: bool,
}

impl<IO> Out<IO> {
    pub(super) fn new(io: IO) -> Rc<RefCell<Out<IO>>> {
        Rc::new(RefCell::new(Out { io, buf: Vec::new(), off: 0, gather: false, dirty: false }))
    }

    /// From now on, writes are gathered until `poll_send`.
    pub(super) fn gather(&mut self) {
        self.gather = true;
    }
}

impl<IO: AsyncWrite + Unpin> Out<IO> {
    /// Writes out what gathered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.off < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.off..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.off += n;
            self.dirty = true;
        }
        // Freed once sent: an idle connection keeps no gathering buffer (one allocation
        // per wakeup that wrote, shared by all it wrote).
        self.buf = Vec::new();
        self.off = 0;
        Poll::Ready(Ok(()))
    }

    /// Ends the stream without waiting (a TLS stream's close_notify, then FIN), when
    /// the connection's grace is used up.
    pub(super) fn shutdown_now(&mut self) {
        crate::io::conn::shutdown_now(&mut self.io);
    }

    /// Sends what gathered and flushes the stream (a TLS stream's last record).
    pub(super) fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        if self.dirty {
            ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.dirty = false;
        }
        Poll::Ready(Ok(()))
    }
}

/// Reads frame headers as the bytes go by; never changes a byte.
pub(super) struct Watch<IO> {
    out: Rc<RefCell<Out<IO>>>,
    /// Bytes read before the protocol was known, given back first.
    prefix: Vec<u8>,
    pos: usize,
    flood: std::rc::Rc<Flood>,
    /// Preface bytes still to pass before the first frame.
    preface: u8,
    /// The frame header being assembled.
    head: [u8; 9],
    head_len: u8,
    /// Payload bytes of the current frame still to pass.
    skip: u32,
    /// A frame passed a limit: h2 gets nothing from it on (the connection task ends the
    /// connection with GOAWAY).
    cut: bool,
}

impl<IO> Watch<IO> {
    pub(super) fn new(out: Rc<RefCell<Out<IO>>>, flood: Rc<Flood>, prefix: Vec<u8>) -> Self {
        let preface = PREFACE.len() as u8;
        Watch {
            out,
            prefix,
            pos: 0,
            flood,
            preface,
            head: [0; 9],
            head_len: 0,
            skip: 0,
            cut: false,
        }
    }

    /// Reads the frame headers in `bytes`; returns how many of the bytes may reach h2:
    /// all of them, or those before the header of the first frame past a limit (that
    /// frame and everything after it are never processed, so a flood read in one go
    /// gets no more answers than the limit allows).
    fn scan(&mut self, mut bytes: &[u8]) -> usize {
        let total = bytes.len();
        while !bytes.is_empty() {
            if self.preface > 0 {
                let n = bytes.len().min(usize::from(self.preface));
                self.preface -= n as u8;
                bytes = &bytes[n..];
                continue;
            }
            if self.skip > 0 {
                let n = bytes.len().min(self.skip as usize);
                self.skip -= n as u32;
                bytes = &bytes[n..];
                continue;
            }
            let have = usize::from(self.head_len);
            // Where this frame's header starts among `bytes` (0 when it began in an
            // earlier read).
            let start = (total - bytes.len()).saturating_sub(have);
            let n = bytes.len().min(9 - have);
            self.head[have..have + n].copy_from_slice(&bytes[..n]);
            self.head_len += n as u8;
            bytes = &bytes[n..];
            if self.head_len == 9 {
                self.head_len = 0;
                let h = &self.head;
                self.skip = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                let over = match (h[3], h[4] & ACK) {
                    (RST_STREAM, _) => self.flood.count(RESETS),
                    (PING, 0) => self.flood.count(PINGS),
                    (SETTINGS, 0) => self.flood.count(SETTINGS_FRAMES),
                    _ => false,
                };
                if over {
                    self.cut = true;
                    return start;
                }
            }
        }
        total
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watch<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.cut {
            // Nothing more for h2. The connection task, which saw the limit passed in the
            // same poll, is closing the connection; its timer and writes wake it.
            return Poll::Pending;
        }
        let before = buf.filled().len();
        if this.pos < this.prefix.len() {
            let n = (this.prefix.len() - this.pos).min(buf.remaining());
            buf.put_slice(&this.prefix[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.prefix.len() {
                // Replayed: free it rather than keep it for the connection's life.
                this.prefix = Vec::new();
                this.pos = 0;
            }
        } else {
            ready!(Pin::new(&mut this.out.borrow_mut().io).poll_read(cx, buf))?;
        }
        // Scanning needs `this` mutably while the new bytes borrow `buf`, not `this`.
        let new = &buf.filled()[before..];
        let (len, keep) = (new.len(), this.scan(new));
        if keep < len {
            buf.set_filled(before + keep);
            if keep == 0 {
                // An empty read would tell h2 the client closed.
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watch<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut out = self.out.borrow_mut();
        let out = &mut *out;
        if !out.gather {
            out.dirty = true;
            return Pin::new(&mut out.io).poll_write_vectored(cx, bufs);
        }
        if out.buf.len() >= GATHER_MAX {
            ready!(out.poll_drain(cx))?;
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if out.buf.is_empty() && total >= DIRECT {
            out.dirty = true;
            return Pin::new(&mut out.io).poll_write_vectored(cx, bufs);
        }
        let room = GATHER_MAX - out.buf.len();
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(room - n);
            out.buf.extend_from_slice(&b[..take]);
            n += take;
            if n == room {
                break;
            }
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Gathering, h2's flushes wait for the connection task's `Out::poll_send`.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.out.borrow_mut();
        if out.gather {
            return Poll::Ready(Ok(()));
        }
        out.poll_send(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.out.borrow_mut();
        ready!(out.poll_send(cx))?;
        Pin::new(&mut out.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
        f.extend_from_slice(payload);
        f
    }

    fn watch(max_pings: u32) -> Watch<()> {
        let cfg = crate::config::Http2 { max_pings, ..Default::default() };
        Watch::new(Out::new(()), std::rc::Rc::new(Flood::new(&cfg)), Vec::new())
    }

    #[test]
    fn counts_pings_split_anywhere_and_ignores_acks_and_payloads() {
        let mut bytes = PREFACE.to_vec();
        // A DATA frame whose payload looks like PING headers must not count.
        let fake = frame(PING, 0, &[0; 8]);
        bytes.extend(frame(0x0, 0, &fake.repeat(3)));
        bytes.extend(frame(PING, ACK, &[0; 8]));
        for _ in 0..3 {
            bytes.extend(frame(PING, 0, &[0; 8]));
        }
        for split in 1..bytes.len() {
            let mut w = watch(2);
            for piece in bytes.chunks(split) {
                w.scan(piece);
            }
            assert_eq!(w.flood.counts[PINGS].get(), 3, "split {split}");
            assert!(w.flood.tripped().is_some_and(|t| t.contains("PING")));
        }
        let mut w = watch(3);
        assert_eq!(w.scan(&bytes), bytes.len());
        assert_eq!(w.flood.tripped(), None);
    }

    /// The frame that passes a limit, and everything after it, never reach h2: at most
    /// the bytes of its header already passed in an earlier read.
    #[test]
    fn the_frame_past_a_limit_and_all_after_it_are_cut_off() {
        let mut bytes = PREFACE.to_vec();
        let ping = frame(PING, 0, &[0; 8]);
        let first_over = bytes.len() + 2 * ping.len();
        bytes.extend(ping.repeat(5));
        for split in 1..bytes.len() {
            let mut w = watch(2);
            let mut passed = 0;
            for piece in bytes.chunks(split) {
                let keep = w.scan(piece);
                passed += keep;
                if keep < piece.len() {
                    break;
                }
            }
            assert!(w.cut, "split {split}");
            assert!((first_over..first_over + 9).contains(&passed), "split {split}: {passed}");
        }
    }
}
