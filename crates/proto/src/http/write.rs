//! Head writers: produce the request head sent to the origin and the
//! response head sent back to the client, copying field bytes verbatim from
//! the parsed buffer and dropping hop-by-hop fields (RFC 9110 7.6.1).
//!
//! Content-Length and Transfer-Encoding are always kept, even if a
//! Connection header names them, because the proxy forwards body bytes
//! unchanged and dropping their framing would desynchronise the next hop
//! (the parsers already reject such heads; this is a second fence).
//! Content-Length goes out once, with one value, even when identical values
//! came listed or repeated: RFC 9110 8.6 lets a recipient accept those, and a
//! next hop that does not would refuse the message or read another length.
//!
//! [`write_connect`] writes the CONNECT that asks a parent proxy for a tunnel.

use super::fields::{self, Known};
use super::target::is_host_char;
use super::{ConnFlags, HeadError, Header, Method, RequestHead, ResponseHead, Target};
use crate::addr::{Address, Host};
use std::net::IpAddr;

/// Options for rewriting the request head sent upstream.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestRewrite<'a> {
    /// Add/extend `Via: 1.x <via>` (pseudonym like "rustle"), off when None.
    /// The version is the one the client spoke (RFC 9110 7.6.3).
    pub via: Option<&'a str>,
    /// Client address text (a bare IPv4 or IPv6 address) to append to
    /// X-Forwarded-For and as `Forwarded: for=...` (IPv6 quoted and
    /// bracketed per RFC 7239), off when None.
    pub forwarded_for: Option<&'a str>,
    /// Keep Upgrade and send `Connection: upgrade` (the request is an
    /// upgrade the proxy will relay).
    pub upgrade: bool,
    /// Keep an absolute-form target as received (the request goes to another
    /// proxy, not to its origin).
    pub absolute: bool,
    /// A `Proxy-Authorization` value for the next proxy (the client's own is
    /// never forwarded).
    pub proxy_authorization: Option<&'a [u8]>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseRewrite<'a> {
    /// Add/extend `Via: 1.x <via>` with the origin's version.
    pub via: Option<&'a str>,
    /// The proxy will close the client connection after this response: write `Connection: close`.
    pub close: bool,
    /// The client spoke HTTP/1.0 and the connection stays open: write `Connection: keep-alive`.
    pub keep_alive_10: bool,
    /// 101 Switching Protocols being relayed: keep Upgrade and write `Connection: upgrade`.
    pub upgrade: bool,
    /// The proxy removes the chunked framing (for an HTTP/1.0 client, which cannot read
    /// it): drop Transfer-Encoding; the body then ends with the connection.
    pub dechunk: bool,
}

/// Append to `out` the request head to send to the origin: request line in
/// origin-form (`/` when the path is empty) with HTTP/1.1, `Host:
/// <authority>` first, the client's fields minus Host and hop-by-hop ones,
/// Max-Forwards decremented for OPTIONS/TRACE (saturating at 0: answering a
/// Max-Forwards: 0 request itself is the caller's job), then Via /
/// X-Forwarded-For / Forwarded (appended to the last existing field of that
/// name, else added), `Connection: upgrade` if asked, and the final CRLF.
///
/// For targets other than absolute-form the target is written as received
/// and Host is the client's Host (or the authority, for CONNECT).
pub fn write_request(head: &RequestHead, buf: &[u8], rw: &RequestRewrite, out: &mut Vec<u8>) {
    let strip = Strip::new(&head.headers, buf, &head.conn, rw.upgrade, true);
    out.extend_from_slice(head.method_span.get(buf));
    out.push(b' ');
    let host = match head.target {
        Target::Absolute { authority, .. } if rw.absolute => {
            out.extend_from_slice(head.target_span.get(buf));
            Some(authority)
        }
        Target::Absolute { authority, path, .. } => {
            let p = path.get(buf);
            // Empty path, or a bare `?query`, still needs the leading slash.
            if p.first() != Some(&b'/') {
                out.push(b'/');
            }
            out.extend_from_slice(p);
            Some(authority)
        }
        Target::Authority { authority, .. } => {
            out.extend_from_slice(head.target_span.get(buf));
            Some(authority)
        }
        Target::Origin { .. } | Target::Asterisk => {
            out.extend_from_slice(head.target_span.get(buf));
            head.host
        }
    };
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(h) = host {
        push_field(out, b"Host", h.get(buf));
    }

    let via = rw.via.map(|v| (Received::Http1 { minor: head.minor }, v));
    let last_via = strip.last_kept(Known::Via, via.is_some());
    let last_xff = strip.last_kept(Known::XForwardedFor, rw.forwarded_for.is_some());
    let last_fwd = strip.last_kept(Known::Forwarded, rw.forwarded_for.is_some());
    let decrement = matches!(head.method, Method::Options | Method::Trace);
    let mut run = Run::new(buf);
    let mut length = OneLength::default();
    for (i, h) in head.headers.iter().enumerate() {
        let name = h.name.get(buf);
        let kind = h.kind;
        if !strip.keep(name, kind) {
            run.end(out, h);
            continue;
        }
        if head.length_list && length.rewritten(kind, h, buf, &mut run, out) {
            continue;
        }
        let value = h.value.get(buf);
        if kind == Known::TransferEncoding {
            // The one coding a request may carry (the parser refuses any other), in its
            // plain spelling: `\tCHUNKED\t` goes on as `chunked`.
            run.end(out, h);
            push_field(out, b"Transfer-Encoding", b"chunked");
            continue;
        }
        let decremented = match kind {
            Known::MaxForwards if decrement => fields::max_forwards(value).ok(),
            _ => None,
        };
        let last = Some(i);
        let append = match (kind, via, rw.forwarded_for) {
            (Known::Via, Some(_), _) => last == last_via,
            (Known::XForwardedFor, _, Some(_)) => last == last_xff,
            (Known::Forwarded, _, Some(_)) => last == last_fwd,
            _ => false,
        };
        if decremented.is_none() && !append {
            run.extend(h);
            continue;
        }
        run.end(out, h);
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        match decremented {
            Some(n) => push_decimal(out, n.saturating_sub(1)),
            None => out.extend_from_slice(value),
        }
        match (kind, via, rw.forwarded_for) {
            (Known::Via, Some((received, v)), _) if append => {
                push_list_sep(out, value);
                push_via(out, received, v);
            }
            (Known::XForwardedFor, _, Some(addr)) if append => {
                push_list_sep(out, value);
                push_clean(out, addr, false);
            }
            (Known::Forwarded, _, Some(addr)) if append => {
                push_list_sep(out, value);
                push_forwarded_for(out, addr);
            }
            _ => {}
        }
        out.extend_from_slice(b"\r\n");
    }
    run.finish(out, head.len);
    let received = Received::Http1 { minor: head.minor };
    let appended =
        Appended { via: last_via.is_some(), xff: last_xff.is_some(), fwd: last_fwd.is_some() };
    push_added(out, rw, received, appended);
    out.extend_from_slice(b"\r\n");
}

/// Which of Via, X-Forwarded-For and Forwarded got the proxy's element appended to a
/// field the client sent (and need no field of their own).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Appended {
    pub via: bool,
    pub xff: bool,
    pub fwd: bool,
}

/// The fields a forwarded request gets from the proxy, after the client's: the next
/// proxy's credentials, Via, X-Forwarded-For and Forwarded where no client field took
/// the proxy's element (`appended`), and `Connection: upgrade` for an upgrade.
pub(super) fn push_added(
    out: &mut Vec<u8>,
    rw: &RequestRewrite,
    received: Received,
    appended: Appended,
) {
    if let Some(value) = rw.proxy_authorization {
        push_field(out, b"Proxy-Authorization", value);
    }
    if let (Some(v), false) = (rw.via, appended.via) {
        out.extend_from_slice(b"Via: ");
        push_via(out, received, v);
        out.extend_from_slice(b"\r\n");
    }
    if let Some(addr) = rw.forwarded_for {
        if !appended.xff {
            out.extend_from_slice(b"X-Forwarded-For: ");
            push_clean(out, addr, false);
            out.extend_from_slice(b"\r\n");
        }
        if !appended.fwd {
            out.extend_from_slice(b"Forwarded: ");
            push_forwarded_for(out, addr);
            out.extend_from_slice(b"\r\n");
        }
    }
    if rw.upgrade {
        out.extend_from_slice(b"Connection: upgrade\r\n");
    }
}

/// Append to `out` a CONNECT request for a parent proxy (RFC 9110 9.3.6):
///
/// ```text
/// CONNECT host:port HTTP/1.1
/// Host: host:port
/// Proxy-Authorization: Basic <basic>      (when `basic` is given)
/// ```
///
/// then the empty line. An IPv6 host goes in brackets. `basic` is the RFC 7617
/// credentials already encoded (base64 of `user:password`; this crate has no base64,
/// and a caller may encode once per parent); it must be a token68. A name that is not
/// a reg-name of unreserved characters (what this crate's own parser accepts) is
/// [`HeadError::InvalidHost`], port 0 [`HeadError::InvalidPort`], `basic` with a byte
/// outside token68 [`HeadError::InvalidHeaderValue`]; nothing is written on error.
///
/// The reply is read with [`parse_response`](super::parse_response) and
/// [`Method::Connect`]: a 2xx has no body, and the bytes after its head are the tunnel's.
pub fn write_connect(
    dst: &Address,
    basic: Option<&str>,
    out: &mut Vec<u8>,
) -> Result<(), HeadError> {
    if let Host::Domain(d) = &dst.host {
        if !d.as_bytes().iter().all(|&b| is_host_char(b)) {
            return Err(HeadError::InvalidHost);
        }
    }
    if dst.port == 0 {
        return Err(HeadError::InvalidPort);
    }
    if let Some(b) = basic {
        if !is_token68(b.as_bytes()) {
            return Err(HeadError::InvalidHeaderValue);
        }
    }
    out.extend_from_slice(b"CONNECT ");
    let authority = out.len();
    push_authority(out, dst);
    let authority = authority..out.len();
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_within(authority);
    out.extend_from_slice(b"\r\n");
    if let Some(b) = basic {
        out.extend_from_slice(b"Proxy-Authorization: Basic ");
        out.extend_from_slice(b.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// `host:port`, an IPv6 host in brackets.
fn push_authority(out: &mut Vec<u8>, dst: &Address) {
    use std::io::Write as _;
    // Writing to a Vec cannot fail.
    let _ = match &dst.host {
        Host::Ip(IpAddr::V6(ip)) => write!(out, "[{ip}]"),
        Host::Ip(IpAddr::V4(ip)) => write!(out, "{ip}"),
        Host::Domain(d) => out.write_all(d.as_bytes()),
    };
    out.push(b':');
    push_decimal(out, u32::from(dst.port));
}

/// RFC 9110 11.2: `token68 = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_token68(b: &[u8]) -> bool {
    let body = b.iter().position(|&c| c == b'=').unwrap_or(b.len());
    body > 0
        && b[..body].iter().all(|&c| {
            c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
        && b[body..].iter().all(|&c| c == b'=')
}

/// Append to `out` the response head for the client: `HTTP/1.1 <status>
/// <reason as received>`, fields in order minus the hop-by-hop set (and
/// fields named in Connection), plus Via / Connection as asked, final CRLF.
/// Connection tokens are combined into one field (`upgrade`, `close`, and
/// `keep-alive` only when not closing).
pub fn write_response(head: &ResponseHead, buf: &[u8], rw: &ResponseRewrite, out: &mut Vec<u8>) {
    let strip = Strip::new(&head.headers, buf, &head.conn, rw.upgrade, false);
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u32::from(head.status));
    out.push(b' ');
    out.extend_from_slice(head.reason.get(buf));
    out.extend_from_slice(b"\r\n");

    let last_via = strip.last_kept(Known::Via, rw.via.is_some());
    let mut run = Run::new(buf);
    let mut length = OneLength::default();
    for (i, h) in head.headers.iter().enumerate() {
        let name = h.name.get(buf);
        let kind = h.kind;
        if !strip.keep(name, kind) || (rw.dechunk && kind == Known::TransferEncoding) {
            run.end(out, h);
            continue;
        }
        if head.length_list && length.rewritten(kind, h, buf, &mut run, out) {
            continue;
        }
        let via = match rw.via {
            Some(v) if Some(i) == last_via => v,
            _ => {
                run.extend(h);
                continue;
            }
        };
        run.end(out, h);
        let value = h.value.get(buf);
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        push_list_sep(out, value);
        push_via(out, Received::Http1 { minor: head.minor }, via);
        out.extend_from_slice(b"\r\n");
    }
    run.finish(out, head.len);
    if let (Some(v), None) = (rw.via, last_via) {
        out.extend_from_slice(b"Via: ");
        push_via(out, Received::Http1 { minor: head.minor }, v);
        out.extend_from_slice(b"\r\n");
    }
    let keep_alive = rw.keep_alive_10 && !rw.close;
    if rw.upgrade || rw.close || keep_alive {
        out.extend_from_slice(b"Connection: ");
        let mut sep = false;
        for (on, tok) in
            [(rw.upgrade, &b"upgrade"[..]), (rw.close, b"close"), (keep_alive, b"keep-alive")]
        {
            if on {
                if sep {
                    out.extend_from_slice(b", ");
                }
                out.extend_from_slice(tok);
                sep = true;
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Consecutive fields that go out unchanged, copied as one slice of the
/// received head: their lines as the peer wrote them, CRLFs included. A
/// parsed head has only CRLF line ends and no folded lines, so a field's line
/// runs from its name to the next field's name, and the last one's to the
/// CRLF that ends the head.
struct Run<'b> {
    buf: &'b [u8],
    start: Option<usize>,
}

impl<'b> Run<'b> {
    fn new(buf: &'b [u8]) -> Self {
        Run { buf, start: None }
    }

    /// Field `h` joins the run.
    fn extend(&mut self, h: &Header) {
        self.start.get_or_insert(h.name.start as usize);
    }

    /// Field `h` does not go out as received: the run before it is written.
    fn end(&mut self, out: &mut Vec<u8>, h: &Header) {
        if let Some(start) = self.start.take() {
            debug_assert!(start < h.name.start as usize, "a run ends after it starts");
            out.extend_from_slice(self.buf.get(start..h.name.start as usize).unwrap_or_default());
        }
    }

    /// The head (`len` bytes, ending in the empty line) is over.
    fn finish(&mut self, out: &mut Vec<u8>, len: usize) {
        if let Some(start) = self.start.take() {
            let end = len.saturating_sub(2);
            debug_assert!(start < end, "a run ends after it starts");
            out.extend_from_slice(self.buf.get(start..end).unwrap_or_default());
        }
    }
}

/// Content-Length, once: the first field goes out (as received when it holds one value,
/// else with its first value, the parser having checked they are all the same), later
/// ones are dropped. Looked at only when the parser saw a list or a repeated field.
#[derive(Default)]
struct OneLength {
    written: bool,
}

impl OneLength {
    /// Whether field `h` was dealt with here (written in its new form, or dropped);
    /// `false` leaves it to the caller (not Content-Length, or its first field holding
    /// a single value).
    fn rewritten(
        &mut self,
        kind: Known,
        h: &Header,
        buf: &[u8],
        run: &mut Run<'_>,
        out: &mut Vec<u8>,
    ) -> bool {
        if kind != Known::ContentLength {
            return false;
        }
        if std::mem::replace(&mut self.written, true) {
            run.end(out, h);
            return true;
        }
        let value = h.value.get(buf);
        if !value.contains(&b',') {
            return false;
        }
        run.end(out, h);
        let first = value.split(|&b| b == b',').next().unwrap_or_default();
        push_field(out, h.name.get(buf), fields::trim_ows(first));
        true
    }
}

/// Decides which fields survive forwarding.
pub(super) struct Strip<'h> {
    headers: &'h [Header],
    buf: &'h [u8],
    keep_upgrade: bool,
    /// Host is replaced in requests, passed through in responses.
    drop_host: bool,
    /// Whether any Connection field lists something besides the
    /// close/keep-alive/upgrade options; almost never, so the per-field
    /// lookup below is skipped in the common case.
    nominates: bool,
    /// Connection says close: a field named Close is one it names (RFC 9110 7.6.1).
    close: bool,
}

impl<'h> Strip<'h> {
    pub(super) fn new(
        headers: &'h [Header],
        buf: &'h [u8],
        conn: &ConnFlags,
        keep_upgrade: bool,
        drop_host: bool,
    ) -> Self {
        let (nominates, close) = (conn.nominates, conn.close);
        Strip { headers, buf, keep_upgrade, drop_host, nominates, close }
    }

    pub(super) fn keep(&self, name: &[u8], kind: Known) -> bool {
        match kind {
            Known::Connection
            | Known::ProxyConnection
            | Known::KeepAlive
            | Known::ProxyAuthorization
            | Known::ProxyAuthenticate
            | Known::Te
            | Known::Trailer => false,
            Known::Host if self.drop_host => false,
            Known::Close if self.close => false,
            // Upgrade is always listed in Connection, so `keep_upgrade`
            // must win over the nomination rule.
            Known::Upgrade => self.keep_upgrade,
            Known::ContentLength | Known::TransferEncoding => true,
            _ => {
                !(self.nominates
                    && connection_tokens(self.headers, self.buf)
                        .any(|t| t.eq_ignore_ascii_case(name)))
            }
        }
    }

    /// Index of the last field of `kind` that will be written, if wanted.
    fn last_kept(&self, kind: Known, wanted: bool) -> Option<usize> {
        if !wanted {
            return None;
        }
        self.headers.iter().rposition(|h| h.kind == kind && self.keep(h.name.get(self.buf), kind))
    }
}

fn connection_tokens<'a>(headers: &'a [Header], buf: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    headers
        .iter()
        .filter(|h| h.kind == Known::Connection)
        .flat_map(move |h| fields::tokens(h.value.get(buf)))
}

pub(super) fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Separator before an appended list element; an empty existing value
/// gets none, so the list does not start with an empty element.
pub(super) fn push_list_sep(out: &mut Vec<u8>, existing: &[u8]) {
    if !existing.is_empty() {
        out.extend_from_slice(b", ");
    }
}

/// The protocol a message came in with, as a Via element names it (RFC 9110 7.6.3).
#[derive(Debug, Clone, Copy)]
pub(super) enum Received {
    /// `1.x`
    Http1 { minor: u8 },
    /// `2`
    Http2,
}

/// One Via element: `<received-protocol> <pseudonym>`.
pub(super) fn push_via(out: &mut Vec<u8>, received: Received, pseudonym: &str) {
    match received {
        Received::Http1 { minor } => {
            out.extend_from_slice(b"1.");
            push_decimal(out, u32::from(minor));
        }
        Received::Http2 => out.push(b'2'),
    }
    out.push(b' ');
    push_clean(out, pseudonym, false);
}

/// `for=` node per RFC 7239 6: IPv6 goes in brackets, and anything that is
/// not a plain token (IPv6, a port, odd text) goes in a quoted-string.
pub(super) fn push_forwarded_for(out: &mut Vec<u8>, addr: &str) {
    out.extend_from_slice(b"for=");
    let a = addr.as_bytes();
    let colons = a.iter().filter(|&&b| b == b':').count();
    let brackets = colons > 1 && a.first() != Some(&b'[');
    if brackets {
        out.extend_from_slice(b"\"[");
        push_clean(out, addr, true);
        out.extend_from_slice(b"]\"");
    } else if a.iter().all(|&b| fields::is_tchar(b)) {
        push_clean(out, addr, false);
    } else {
        out.push(b'"');
        push_clean(out, addr, true);
        out.push(b'"');
    }
}

/// Copy caller-supplied text into a field value, dropping bytes that could
/// end the field or the head (CTLs, CR, LF) and, inside a quoted-string,
/// `"` and `\`. Callers pass addresses and pseudonyms, so normally nothing
/// is dropped; this only stops a misconfiguration from injecting fields.
pub(super) fn push_clean(out: &mut Vec<u8>, s: &str, quoted: bool) {
    for &b in s.as_bytes() {
        let ok = (0x20..0x7f).contains(&b) && !(quoted && (b == b'"' || b == b'\\'));
        if ok {
            out.push(b);
        }
    }
}

/// Appends `v` in decimal, without allocating or a formatter.
pub fn push_decimal(out: &mut Vec<u8>, v: u32) {
    push_u64(out, u64::from(v));
}

/// [`push_decimal`] for any `u64` (a body length).
pub(super) fn push_u64(out: &mut Vec<u8>, mut v: u64) {
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
