//! `rustle-bench floor LISTEN TARGET`: the least a TCP forwarder can do.
//!
//! One thread, one mio poll, a 16 KiB buffer per direction, no parsing, no
//! timers, no limits, no logs: each connection gets its own connection to
//! TARGET and bytes are copied both ways as they come. The campaign runs it
//! as the peer `floor` on the relay and HTTP paths (the origin takes the
//! proxy's absolute-form requests as they are), so that every table shows
//! what the kernel's share of an exchange costs when a proxy's own work is
//! nothing: the bar below which no proxy on the same system calls can go.
//!
//! With `--http` it also does the least an HTTP proxy must do to each head:
//! rustle's own codec parses every request and response head and writes it
//! out again (origin-form target, Host from the URI, hop-by-hop fields
//! dropped), and Content-Length tells where the next head starts. It stays
//! a measuring tool, not a proxy: a head must arrive whole in one read, and
//! a connection whose framing is anything else (chunked, close-delimited, a
//! head it cannot parse, pipelining) is passed through untouched from then
//! on. Having no pool, it asks the origin to close when the client does. Its cost over the plain floor is what the codec costs on a loop with
//! no runtime, timers, pool or policy.
//!
//! It reads until a read comes back short (with edge-triggered readiness a
//! short read means the socket is drained, and new data raises a new edge),
//! so a kept-alive exchange costs it one read and one write per side, like
//! rustle, nginx and haproxy.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};

use anyhow::{Context, Result};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use rustle_proto::http::{
    parse_request, parse_response, write_request, write_response, BodyKind, Limits, RequestHead,
    RequestRewrite, ResponseHead, ResponseRewrite,
};

const BUF: usize = 16 * 1024;
/// With `--http`, reads leave this much room: a rewritten head is at most a
/// few bytes longer than the one received.
const HEADROOM: usize = 256;
const LISTENER: Token = Token(usize::MAX);

/// One direction: bytes read from `from`, not yet all written to the other side.
struct Dir {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// `from` said EOF.
    eof: bool,
    /// An event said `from` was closed for reading: a short read no longer
    /// means drained, as the EOF after the data raises no edge of its own.
    hup: bool,
    /// The other side was shut down for writing, once the buffer had emptied.
    shut: bool,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            buf: vec![0; BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            hup: false,
            shut: false,
        }
    }
}

/// The `--http` state of one connection pair.
struct Codec {
    req: RequestHead,
    resp: ResponseHead,
    out: Vec<u8>,
    /// Per direction: body bytes still to come before the next head.
    body_left: [u64; 2],
    /// Per direction: framing this tool does not follow was seen; the rest
    /// passes through as it is.
    opaque: [bool; 2],
}

struct Pair {
    /// With `--http`.
    codec: Option<Box<Codec>>,
    /// 0: the client, 1: the target.
    s: [TcpStream; 2],
    /// d[0] carries client → target, d[1] target → client.
    d: [Dir; 2],
    connected: bool,
}

/// A bound floor forwarder, not yet running.
pub struct Floor {
    poll: Poll,
    listener: TcpListener,
    http: bool,
}

impl Floor {
    pub fn bind(listen: SocketAddr) -> Result<Floor> {
        // Two descriptors a connection: as many as the process may have.
        let _ = rlimit::increase_nofile_limit(u64::MAX);
        let poll = Poll::new().context("creating the poll")?;
        let mut listener =
            TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(Floor { poll, listener, http: false })
    }

    /// Parses and rewrites every HTTP head with rustle's codec (see the
    /// module's notes).
    pub fn http(mut self, on: bool) -> Floor {
        self.http = on;
        self
    }

    pub fn addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Forwards every connection to `target`, until the process ends.
    pub fn run(self, target: SocketAddr) -> Result<()> {
        run(self.poll, self.listener, target, self.http)
    }
}

fn run(mut poll: Poll, listener: TcpListener, target: SocketAddr, http: bool) -> Result<()> {
    let mut pairs: Vec<Option<Pair>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut ended: Vec<usize> = Vec::new();
    let mut events = Events::with_capacity(1024);
    loop {
        // Slots freed in the last round are reused only now, so that an event
        // still queued for an ended pair cannot reach a new one.
        free.append(&mut ended);
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("polling"),
        }
        for ev in events.iter() {
            if ev.token() == LISTENER {
                accept(&poll, &listener, target, http, &mut pairs, &mut free);
                continue;
            }
            let i = ev.token().0 >> 1;
            let Some(pair) = pairs.get_mut(i).and_then(Option::as_mut) else { continue };
            let side = ev.token().0 & 1;
            if ev.is_read_closed() || ev.is_error() {
                pair.d[side].hup = true;
            }
            let was_up = pair.connected;
            let open = match step_connect(pair) {
                // Only what the event concerns: reading its side, or writing to it
                // what the other side left pending; both once, when the connection
                // to the target has just come up.
                Ok(true) => {
                    let read = !was_up || ev.is_readable() || pair.d[side].hup;
                    // Edge-triggered events carry the whole readiness mask, so a
                    // socket's every event says writable: only a direction held up by
                    // a full socket takes it as a cue.
                    let held = pair.d[1 - side].start < pair.d[1 - side].end;
                    let write = !was_up || (ev.is_writable() && held);
                    let r = if read { pump(pair, side) } else { Ok(()) };
                    r.and_then(|()| if write { pump(pair, 1 - side) } else { Ok(()) })
                        .map(|()| !(pair.d[0].shut && pair.d[1].shut))
                }
                Ok(false) => Ok(true),
                Err(e) => Err(e),
            };
            if matches!(open, Ok(true)) {
                continue;
            }
            if let Some(mut p) = pairs[i].take() {
                for s in &mut p.s {
                    let _ = poll.registry().deregister(s);
                }
            }
            ended.push(i);
        }
    }
}

fn accept(
    poll: &Poll,
    listener: &TcpListener,
    target: SocketAddr,
    http: bool,
    pairs: &mut Vec<Option<Pair>>,
    free: &mut Vec<usize>,
) {
    loop {
        let (client, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            // The one connection is gone; those queued behind it are not.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            // Out of descriptors or the like: the next event on the listener retries.
            Err(_) => return,
        };
        let Ok(up) = TcpStream::connect(target) else { continue };
        let _ = client.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let i = free.pop().unwrap_or_else(|| {
            pairs.push(None);
            pairs.len() - 1
        });
        let codec = http.then(|| {
            Box::new(Codec {
                req: RequestHead::new(),
                resp: ResponseHead::new(),
                out: Vec::with_capacity(4096),
                body_left: [0; 2],
                opaque: [false; 2],
            })
        });
        let mut pair =
            Pair { codec, s: [client, up], d: [Dir::new(), Dir::new()], connected: false };
        let both = Interest::READABLE | Interest::WRITABLE;
        let ok = poll.registry().register(&mut pair.s[0], Token(i << 1), both).is_ok()
            && poll.registry().register(&mut pair.s[1], Token(i << 1 | 1), both).is_ok();
        if ok {
            pairs[i] = Some(pair);
        } else {
            free.push(i);
        }
    }
}

/// `Ok(true)` once the connection to the target is up.
fn step_connect(pair: &mut Pair) -> io::Result<bool> {
    if pair.connected {
        return Ok(true);
    }
    if let Some(e) = pair.s[1].take_error()? {
        return Err(e);
    }
    match pair.s[1].peer_addr() {
        Ok(_) => {
            pair.connected = true;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

/// Moves what can be moved from side `from` to the other side, until a
/// write would block or a short read says the source is drained.
fn pump(pair: &mut Pair, from: usize) -> io::Result<()> {
    let [a, b] = &pair.s;
    let (src, dst) = if from == 0 { (a, b) } else { (b, a) };
    let d = &mut pair.d[from];
    let codec = &mut pair.codec;
    let mut drained = false;
    loop {
        while d.start < d.end {
            match (&*dst).write(&d.buf[d.start..d.end]) {
                Ok(n) => d.start += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        d.start = 0;
        d.end = 0;
        if d.eof {
            if !d.shut {
                d.shut = true;
                let _ = dst.shutdown(Shutdown::Write);
            }
            return Ok(());
        }
        if drained {
            return Ok(());
        }
        let want = if codec.is_some() { BUF - HEADROOM } else { BUF };
        match (&*src).read(&mut d.buf[..want]) {
            Ok(0) => d.eof = true,
            Ok(n) => {
                d.end = n;
                if let Some(c) = codec.as_deref_mut() {
                    rewrite(c, from, d);
                }
                // With edge-triggered readiness a short read means the socket
                // is drained, and new data raises a new edge.
                drained = n < want && !d.hup;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// `--http`: the bytes just read into `d` from side `from` start a head when
/// no body bytes are due; it is parsed and written out again in their place.
fn rewrite(c: &mut Codec, from: usize, d: &mut Dir) {
    // Answers are read with the request they answer: once requests pass as they
    // are, so do responses.
    if c.opaque[from] || (from == 1 && c.opaque[0]) {
        c.opaque[from] = true;
        return;
    }
    let n = d.end as u64;
    if c.body_left[from] > 0 {
        // A read holding a body's end and more (the next message) loses track.
        c.opaque[from] |= n > c.body_left[from];
        c.body_left[from] -= n.min(c.body_left[from]);
        return;
    }
    let limits = Limits::default();
    let buf = &d.buf[..d.end];
    c.out.clear();
    let (len, body) = if from == 0 {
        if !matches!(parse_request(buf, &limits, &mut c.req), Ok(Some(()))) {
            c.opaque[from] = true;
            return;
        }
        let rw = RequestRewrite {
            via: None,
            forwarded_for: None,
            upgrade: false,
            absolute: false,
            proxy_authorization: None,
        };
        write_request(&c.req, buf, &rw, &mut c.out);
        if !c.req.keep_alive() {
            // No pool here: the origin closes after its answer, and its FIN
            // closes the client as on the plain floor.
            c.out.truncate(c.out.len() - 2);
            c.out.extend_from_slice(b"Connection: close\r\n\r\n");
        }
        (c.req.len, c.req.body)
    } else {
        if !matches!(parse_response(buf, &limits, c.req.method, &mut c.resp), Ok(Some(()))) {
            c.opaque[from] = true;
            return;
        }
        let rw = ResponseRewrite { close: !c.req.keep_alive(), ..ResponseRewrite::default() };
        write_response(&c.resp, buf, &rw, &mut c.out);
        (c.resp.len, c.resp.body)
    };
    let after = (buf.len() - len) as u64;
    match body {
        BodyKind::None if after == 0 => {}
        BodyKind::Length(total) if after <= total => c.body_left[from] = total - after,
        // Chunked, close-delimited, or more than one message in the read.
        _ => c.opaque[from] = true,
    }
    let total = c.out.len() + buf.len() - len;
    if total > d.buf.len() {
        // Cannot happen with HEADROOM; passing the head on as received is
        // still correct.
        return;
    }
    d.buf.copy_within(len..d.end, c.out.len());
    d.buf[..c.out.len()].copy_from_slice(&c.out);
    d.end = total;
}
