//! The access log: one line per request, tunnel or refused connection. Every front end
//! fills in one record (`Record`), ended by `exchange::end`; the format (`format`: plain, JSON, squid's native format
//! or a template) is only a way to write it, and the sink (`sink`: a stream, a file,
//! syslog or the journal) only where the lines go. Each worker formats into its own buffer
//! and hands it to the sink when it fills or on the housekeeping tick, so a request costs
//! no syscall and no lock for logging.

mod format;
mod sink;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::Listener;
use crate::config::LogFormat;
use crate::telemetry::metrics::ListenerCounters;

pub(crate) use sink::Sink;

/// A worker hands its buffer to the sink once it holds this much, so a busy worker makes
/// one write call per few hundred lines.
const FLUSH_AT: usize = 32 * 1024;

pub(crate) use crate::protocol::{Protocol, Version};

/// One exchange's record (a request, a tunnel, a refused connection): what every front end
/// fills in when it ends, and what `exchange::end` counts (the user's traffic, the
/// metrics) and writes as its one log line. It borrows what the front end holds, so
/// filling it costs no allocation.
pub(crate) struct Record<'a> {
    pub(crate) client: SocketAddr,
    /// The listener the client came in on.
    pub(crate) listener: &'a Listener,
    /// Its counters, for the metrics.
    pub(crate) counters: &'a ListenerCounters,
    /// The authenticated user (never a password).
    pub(crate) user: Option<&'a str>,
    /// What the client asked for, as far as it was told.
    pub(crate) protocol: Protocol,
    /// The HTTP version it spoke (HTTP exchanges).
    pub(crate) version: Version,
    /// The request's method and target, and its User-Agent and Referer when the format
    /// shows them (`AccessLog::wants_headers`). Read only for the log line: filling it is
    /// one pointer, whatever the front end keeps them in.
    pub(crate) label: &'a dyn Shown,
    pub(crate) upstream: Option<SocketAddr>,
    /// The route and the parent proxies taken, when a route sent the request through
    /// parents.
    pub(crate) via: Option<&'a Via>,
    /// The status the client got; 0 when it got none (it went away first, or the protocol
    /// has no status to give). SOCKS: the reply code.
    pub(crate) status: u16,
    /// Bytes from the client to the upstream (request body or tunnel).
    pub(crate) up: u64,
    /// Bytes from the upstream to the client (response body or tunnel).
    pub(crate) down: u64,
    /// When it began (its request head read, or its connection accepted).
    pub(crate) start: Instant,
    /// It became a tunnel (set up, then relayed), for the metrics' durations.
    pub(crate) tunnel: bool,
    /// The client's TLS session, on TLS ports.
    pub(crate) tls: Option<&'a crate::io::tls::Session>,
    /// Why the exchange failed, when it did (`exchange::end` fills it from its error).
    pub(crate) error: Option<&'a dyn fmt::Display>,
    /// When the failure was a refusal, what refused it (squid's format shows a refusal
    /// for credentials as `TCP_DENIED/407` whatever the protocol).
    pub(crate) refused: Option<crate::error::Refused>,
    /// Of `up` and `down`, the bytes already added to the user's traffic as they moved
    /// (a relay with the user's counters): `exchange::end` adds only the rest.
    pub(crate) counted: (u64, u64),
}

impl<'a> Record<'a> {
    /// What is known of any exchange from its start: who, on which listener, speaking
    /// what; the rest is empty (`-` for the method and target) until filled in.
    pub(crate) fn new(
        client: SocketAddr,
        listener: &'a Listener,
        counters: &'a ListenerCounters,
        protocol: Protocol,
        start: Instant,
    ) -> Record<'a> {
        Record {
            client,
            listener,
            counters,
            user: None,
            protocol,
            version: Version::Unknown,
            label: &DASHES,
            upstream: None,
            via: None,
            status: 0,
            up: 0,
            down: 0,
            start,
            tunnel: false,
            tls: None,
            error: None,
            refused: None,
            counted: (0, 0),
        }
    }

    /// The protocol, version, method, target, User-Agent and Referer from `label`.
    pub(crate) fn label<B: AsRef<[u8]>>(&mut self, label: &'a Label<B>) {
        self.protocol = label.protocol;
        self.version = label.version;
        self.label = label;
    }

    /// The method; `-` when the request was refused before its method was read.
    pub(crate) fn method(&self) -> &'a [u8] {
        or_dash(self.label.method())
    }

    /// The target; `-` when the request was refused before its target was read.
    pub(crate) fn target(&self) -> &'a [u8] {
        or_dash(self.label.target())
    }

    /// The User-Agent; empty when not kept.
    pub(crate) fn user_agent(&self) -> &'a [u8] {
        self.label.user_agent()
    }

    /// The Referer; empty when not kept.
    pub(crate) fn referer(&self) -> &'a [u8] {
        self.label.referer()
    }

    /// The protocol as the line names it.
    pub(crate) fn protocol_name(&self) -> &'static str {
        self.protocol.log_name(self.version)
    }
}

fn or_dash(part: &[u8]) -> &[u8] {
    if part.is_empty() {
        b"-"
    } else {
        part
    }
}

/// What a log line shows of a request: its method and target, and its User-Agent and
/// Referer when kept.
pub(crate) trait Shown {
    fn method(&self) -> &[u8];
    fn target(&self) -> &[u8];
    fn user_agent(&self) -> &[u8] {
        b""
    }
    fn referer(&self) -> &[u8] {
        b""
    }
}

/// A method and target as the front end holds them (SOCKS, relays, refusals).
pub(crate) struct Parts<'a> {
    pub(crate) method: &'a [u8],
    pub(crate) target: &'a [u8],
}

impl Shown for Parts<'_> {
    fn method(&self) -> &[u8] {
        self.method
    }

    fn target(&self) -> &[u8] {
        self.target
    }
}

/// Nothing known yet: `-` for both.
const DASHES: Parts<'static> = Parts { method: b"-", target: b"-" };

/// What a log line shows of a request that outlives its head: the method, the target,
/// the User-Agent and the Referer, in one buffer, with the protocol and version. An HTTP/1
/// connection reuses one (`Label<Vec<u8>>`) from request to request; an open tunnel keeps
/// one allocation (`Label`, boxed), or none once parked (`pack`).
pub(crate) struct Label<B = Box<[u8]>> {
    bytes: B,
    /// Where the method, target and User-Agent end (the Referer ends with `bytes`);
    /// `NONE` for a part not given, which is empty.
    ends: [u16; 3],
    pub(crate) protocol: Protocol,
    pub(crate) version: Version,
}

/// The longest part a label keeps (a longer one is cut for the log).
const PART_MAX: usize = u16::MAX as usize / 4;

/// A label's end for a part not given (beyond any part's end).
const NONE: u16 = u16::MAX;

impl<B: AsRef<[u8]>> Label<B> {
    fn part(&self, i: usize) -> &[u8] {
        let bytes = self.bytes.as_ref();
        let from = if i == 0 { 0 } else { usize::from(self.ends[i - 1]) };
        let to = self.ends.get(i).map_or(bytes.len(), |&e| usize::from(e));
        bytes.get(from..to).unwrap_or_default()
    }
}

impl<B: AsRef<[u8]>> Shown for Label<B> {
    fn method(&self) -> &[u8] {
        self.part(0)
    }

    fn target(&self) -> &[u8] {
        self.part(1)
    }

    fn user_agent(&self) -> &[u8] {
        self.part(2)
    }

    fn referer(&self) -> &[u8] {
        self.part(3)
    }
}

impl Label<Vec<u8>> {
    /// Empties the label for the next request (keeping its buffer).
    pub(crate) fn clear(&mut self, protocol: Protocol, version: Version) {
        self.bytes.clear();
        self.ends = [NONE; 3];
        self.protocol = protocol;
        self.version = version;
    }

    /// Adds the next part (the method, the target, the User-Agent, the Referer, in order).
    pub(crate) fn push(&mut self, part: &[u8]) {
        let Some(i) = self.ends.iter().position(|&e| e == NONE) else {
            // The Referer: it ends with the bytes, unless it was given already.
            if self.bytes.len() == usize::from(self.ends[2]) {
                self.bytes.extend_from_slice(&part[..part.len().min(PART_MAX)]);
            }
            return;
        };
        self.bytes.extend_from_slice(&part[..part.len().min(PART_MAX)]);
        // At most 3 * PART_MAX: fits.
        self.ends[i] = self.bytes.len() as u16;
    }

    /// A copy in one allocation of its own, for a tunnel that outlives the connection's
    /// buffer.
    pub(crate) fn boxed(&self) -> Label {
        let parts = [self.method(), self.target(), self.user_agent(), self.referer()];
        let mut label = Label::new(parts);
        (label.protocol, label.version) = (self.protocol, self.version);
        label
    }
}

impl Default for Label<Vec<u8>> {
    fn default() -> Self {
        Label {
            bytes: Vec::new(),
            ends: [NONE; 3],
            protocol: Protocol::Unknown,
            version: Version::Unknown,
        }
    }
}

impl Label {
    /// A label of the method, target, User-Agent and Referer (the last two empty when the
    /// log does not show them) in one allocation (none when all are empty). Its protocol
    /// and version are to be set.
    pub(crate) fn new(parts: [&[u8]; 4]) -> Label {
        let parts = parts.map(|p| &p[..p.len().min(PART_MAX)]);
        let mut ends = [0u16; 3];
        let mut at = 0;
        for (end, part) in ends.iter_mut().zip(parts) {
            at += part.len();
            // At most 3 * PART_MAX: fits.
            *end = at as u16;
        }
        Label {
            bytes: parts.concat().into(),
            ends,
            protocol: Protocol::Unknown,
            version: Version::Unknown,
        }
    }

    /// Moves a short label out of its allocation (leaving this one empty), for a parked
    /// tunnel: a small allocation that outlives everything around it would keep a whole
    /// page of freed memory from going back to the kernel.
    pub(crate) fn pack(&mut self) -> Option<PackedLabel> {
        let len = u8::try_from(self.bytes.len()).ok().filter(|&n| usize::from(n) <= PACKED)?;
        let mut bytes = [0u8; PACKED];
        bytes[..self.bytes.len()].copy_from_slice(&self.bytes);
        // Each end is at most `len`, which fits a byte, or `NONE`.
        let ends = self.ends.map(|e| if e == NONE { u8::MAX } else { e as u8 });
        let (protocol, version) = (self.protocol, self.version);
        *self = Label { bytes: Box::default(), ends: [0; 3], protocol, version };
        Some(PackedLabel { bytes, len, ends, protocol, version })
    }

    pub(crate) fn unpack(p: &PackedLabel) -> Label {
        let bytes = &p.bytes[..usize::from(p.len)];
        let ends = p.ends.map(|e| if e == u8::MAX { NONE } else { u16::from(e) });
        Label { bytes: bytes.into(), ends, protocol: p.protocol, version: p.version }
    }
}

/// Longest label a parked tunnel keeps inline (the whole `PackedLabel` in 64 bytes).
const PACKED: usize = 58;

/// A label without an allocation (see `Label::pack`).
pub(crate) struct PackedLabel {
    bytes: [u8; PACKED],
    len: u8,
    ends: [u8; 3],
    protocol: Protocol,
    version: Version,
}

/// A route through parent proxies, as the log names it.
#[derive(Debug, Default)]
pub(crate) struct Via {
    pub(crate) route: Box<str>,
    /// The parents taken, in order, comma-separated.
    pub(crate) parents: Box<str>,
    /// The route's and the parents' counters (none for a connection that failed).
    pub(crate) through: crate::telemetry::metrics::Through,
}

impl Via {
    /// The last parent taken (the one whose bytes the client got), as the log names it.
    pub(crate) fn last_parent(&self) -> &str {
        self.parents.rsplit(',').next().unwrap_or_default()
    }

    /// The route and parent of a connection through parents that failed to be made, for
    /// its log line.
    pub(crate) fn failed(e: &crate::error::Error) -> Option<Via> {
        use crate::error::{ConnectError, Error};
        match e {
            Error::Connect(ConnectError::Parent(p)) => {
                let (route, parents) = (p.route.clone(), p.name.clone());
                Some(Via { route, parents, ..Default::default() })
            }
            _ => None,
        }
    }
}

pub(crate) struct AccessLog {
    sink: RefCell<Sink>,
    format: RefCell<LogFormat>,
    /// The sink is not `Off` (read per exchange without touching the `RefCell`).
    on: Cell<bool>,
    wants_headers: Cell<bool>,
    /// Lines (or, for datagram sinks, messages) not yet handed to the sink.
    buf: RefCell<Pending>,
    /// The current second, formatted, recomputed only when the second changes.
    clock: RefCell<Clock>,
}

/// A worker's lines not yet written, and where each message ends (datagram sinks send
/// one message per line).
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

/// The wall clock as lines show it, kept per second.
#[derive(Default)]
pub(crate) struct Clock {
    secs: u64,
    /// `YYYY-MM-DDTHH:MM:SS` (UTC).
    iso: String,
    /// `Mmm dd HH:MM:SS` (UTC), for RFC 3164 syslog headers.
    bsd: String,
}

impl Clock {
    fn at(&mut self, secs: u64) {
        if self.secs != secs || self.iso.is_empty() {
            let c = Civil::of(secs);
            self.secs = secs;
            self.iso = c.iso();
            self.bsd = c.bsd();
        }
    }
}

/// A moment as lines show it: the second's texts and the milliseconds.
pub(crate) struct Now<'a> {
    pub(crate) clock: &'a Clock,
    pub(crate) millis: u32,
    pub(crate) unix: Duration,
}

impl AccessLog {
    pub(crate) fn new(sink: Sink, format: LogFormat) -> Self {
        AccessLog {
            on: Cell::new(!matches!(sink, Sink::Off)),
            wants_headers: Cell::new(format.wants_headers()),
            sink: RefCell::new(sink),
            format: RefCell::new(format),
            buf: RefCell::new(Pending {
                bytes: Vec::with_capacity(FLUSH_AT + 1024),
                ends: Vec::new(),
            }),
            clock: RefCell::new(Clock::default()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.on.get()
    }

    /// Where lines go and how they look from now on (a reload): what is buffered is
    /// written out first, where and as it was meant to go.
    pub(crate) fn reconfigure(&self, sink: Sink, format: LogFormat) {
        self.flush();
        self.on.set(!matches!(sink, Sink::Off));
        self.wants_headers.set(format.wants_headers());
        *self.sink.borrow_mut() = sink;
        *self.format.borrow_mut() = format;
    }

    /// Whether lines show the User-Agent or Referer: front ends keep them only then.
    pub(crate) fn wants_headers(&self) -> bool {
        self.wants_headers.get() && self.enabled()
    }

    pub(crate) fn log(&self, e: &Record<'_>) {
        if !self.enabled() {
            return;
        }
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut clock = self.clock.borrow_mut();
        clock.at(unix.as_secs());
        let now = Now { clock: &clock, millis: unix.subsec_millis(), unix };
        let sink = self.sink.borrow();
        let mut pending = self.buf.borrow_mut();
        let Pending { bytes, ends } = &mut *pending;
        sink.open_message(bytes, &now);
        format::write(&self.format.borrow(), bytes, e, &now);
        sink.close_message(bytes, e);
        if sink.is_datagram() {
            ends.push(bytes.len());
        }
        if bytes.len() >= FLUSH_AT {
            sink.write(bytes, ends);
            bytes.clear();
            ends.clear();
        }
    }

    pub(crate) fn flush(&self) {
        let mut pending = self.buf.borrow_mut();
        let Pending { bytes, ends } = &mut *pending;
        if !bytes.is_empty() {
            self.sink.borrow().write(bytes, ends);
            bytes.clear();
            ends.clear();
        }
    }
}

/// A UTC date and time of day.
struct Civil {
    y: i64,
    m: i64,
    d: i64,
    secs: u64,
}

impl Civil {
    /// For a Unix time (the days-to-civil algorithm of Howard Hinnant's date library), so
    /// logging needs no date crate.
    fn of(secs: u64) -> Civil {
        let days = (secs / 86_400) as i64;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        Civil { y, m, d, secs: secs % 86_400 }
    }

    fn iso(&self) -> String {
        let Civil { y, m, d, secs: s } = *self;
        format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    }

    /// RFC 3164's `Mmm dd HH:MM:SS`, the day padded with a space.
    fn bsd(&self) -> String {
        const MONTHS: [&str; 12] =
            ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
        let Civil { m, d, secs: s, .. } = *self;
        let month = MONTHS[(m.clamp(1, 12) - 1) as usize];
        format!("{month} {d:>2} {:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_time_matches_known_dates() {
        assert_eq!(Civil::of(0).iso(), "1970-01-01T00:00:00");
        assert_eq!(Civil::of(951_782_400).iso(), "2000-02-29T00:00:00");
        assert_eq!(Civil::of(1_795_934_498).iso(), "2026-11-29T06:41:38");
        assert_eq!(Civil::of(1_795_934_498).bsd(), "Nov 29 06:41:38");
        assert_eq!(Civil::of(1_733_100_000).bsd(), "Dec  2 00:40:00");
    }

    fn parts<B: AsRef<[u8]>>(l: &Label<B>) -> [&[u8]; 4] {
        [l.method(), l.target(), l.user_agent(), l.referer()]
    }

    #[test]
    fn label_parts_pushed_or_given() {
        let mut l = Label::<Vec<u8>>::default();
        assert_eq!(parts(&l), [b"" as &[u8]; 4]);
        l.clear(Protocol::Http, Version::Http11);
        l.push(b"GET");
        l.push(b"http://a/");
        assert_eq!(parts(&l), [b"GET" as &[u8], b"http://a/", b"", b""]);
        l.push(b"");
        l.push(b"http://r/");
        assert_eq!(parts(&l), [b"GET" as &[u8], b"http://a/", b"", b"http://r/"]);
        // A fifth part is not kept.
        l.push(b"x");
        assert_eq!(l.referer(), b"http://r/");
        // Reused for the next request: nothing of the last one shows.
        l.clear(Protocol::Connect, Version::Http10);
        l.push(b"CONNECT");
        assert_eq!(parts(&l), [b"CONNECT" as &[u8], b"", b"", b""]);
        let boxed = l.boxed();
        assert_eq!(parts(&boxed), parts(&l));
        assert_eq!((boxed.protocol, boxed.version), (Protocol::Connect, Version::Http10));
        // A part too long for the log is cut.
        let long = vec![b'a'; PART_MAX + 10];
        let l = Label::new([b"GET", &long, b"ua", b""]);
        assert_eq!((l.target().len(), l.user_agent()), (PART_MAX, &b"ua"[..]));
    }

    #[test]
    fn label_packs_and_unpacks() {
        let mut l = Label::new([b"CONNECT", b"a:443", b"", b""]);
        (l.protocol, l.version) = (Protocol::Connect, Version::Http2);
        let packed = l.pack().expect("a short label packs");
        assert_eq!(parts(&l), [b"" as &[u8]; 4]);
        let back = Label::unpack(&packed);
        assert_eq!(parts(&back), [b"CONNECT" as &[u8], b"a:443", b"", b""]);
        assert_eq!((back.protocol, back.version), (Protocol::Connect, Version::Http2));
        let mut long = Label::new([b"GET", &[b'a'; PACKED], b"", b""]);
        assert!(long.pack().is_none());
        assert_eq!(std::mem::size_of::<PackedLabel>(), 64);
        assert_eq!(std::mem::size_of::<Label>(), 24);
    }
}
