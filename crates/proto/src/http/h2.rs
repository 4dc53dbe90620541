//! Heads across HTTP versions, for the HTTP/2 front end: a request that came as HTTP/2
//! fields written as the HTTP/1.1 head its origin gets ([`write_h2_request`]), and an
//! HTTP/1.1 response head read as the fields an HTTP/2 client gets
//! ([`h2_response_fields`], [`is_h2_trailer_kept`]).
//!
//! The rules are the HTTP/1 writers' (`write.rs`): the same fields dropped as
//! hop-by-hop (one `Strip`), Via, X-Forwarded-For and Forwarded appended to the last
//! field of the name or added, Max-Forwards decremented for OPTIONS and TRACE. What
//! differs is what HTTP/2 asks for: cookies split into several fields are joined into one
//! (RFC 9113 8.2.3); the body's framing is written from how the proxy sends it, never
//! copied; a response loses its framing fields (RFC 9113 8.2.2) and keeps one
//! Content-Length holding one number, which is all HTTP/2 clients accept.
//!
//! HTTP/2 gives the fields as name and value pairs, not as a head in a buffer: they come
//! in as slices (the caller's `HeaderMap`, without this crate knowing its type), which
//! HTTP/2 has already checked (RFC 9113 8.2.1: names are lowercase tokens, values hold
//! no CR, LF or NUL and no whitespace at either end) and which hold no Connection
//! field (8.2.2).

use super::fields::{self, Known};
use super::write::{
    push_added, push_clean, push_field, push_forwarded_for, push_list_sep, push_u64, push_via,
    Appended, Received, Strip,
};
use super::{BodyKind, ConnFlags, RequestRewrite, ResponseHead};
use crate::chunked::is_dropped_trailer;

/// The request line of an HTTP/2 request: its pseudo-header fields.
#[derive(Debug, Clone, Copy)]
pub struct H2Request<'a> {
    /// `:method`
    pub method: &'a [u8],
    /// `:authority` (or the Host field when the request had none): the Host written,
    /// and the authority of the absolute form.
    pub authority: &'a [u8],
    /// `:path`: path and query, written as they are; empty means `/`.
    pub path: &'a [u8],
}

/// Append to `out` the HTTP/1.1 head for an HTTP/2 request: the request line (origin
/// form, or absolute form `http://<authority><path>` when `rw.absolute`), `Host:
/// <authority>`, the client's `fields` in order minus Host, the framing fields and the
/// hop-by-hop ones (Proxy-Authorization included), Max-Forwards decremented for OPTIONS
/// and TRACE (a Max-Forwards that is not one number is dropped), the cookies as one
/// field (empty ones left out), then what the proxy adds as `rw` says (`Via: 2 <via>`,
/// X-Forwarded-For, Forwarded, the next proxy's credentials), the framing `body` says
/// (Content-Length, `Transfer-Encoding: chunked`, or none) and the final CRLF.
///
/// `fields` gives the fields (name, value) afresh at each call: they are walked once,
/// and once more when they hold cookies. Nothing is allocated but `out`'s growth.
pub fn write_h2_request<'f, I>(
    req: &H2Request<'_>,
    fields: impl Fn() -> I,
    rw: &RequestRewrite<'_>,
    body: BodyKind,
    out: &mut Vec<u8>,
) where
    I: Iterator<Item = (&'f [u8], &'f [u8])>,
{
    out.extend_from_slice(req.method);
    out.push(b' ');
    if rw.absolute {
        out.extend_from_slice(b"http://");
        out.extend_from_slice(req.authority);
    }
    out.extend_from_slice(if req.path.is_empty() { b"/" } else { req.path });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    push_field(out, b"Host", req.authority);

    // No Connection field: nothing is hop-by-hop by nomination.
    let strip = Strip::new(&[], &[], &ConnFlags::default(), rw.upgrade, true);
    let decrement = matches!(req.method, b"OPTIONS" | b"TRACE");
    let mut cookies = false;
    let mut max_forwards = false;
    // Where the last Via, X-Forwarded-For and Forwarded fields end in `out` (before
    // their CRLF), and whether their value is empty: the proxy's element goes there.
    let (mut via, mut xff, mut fwd) = (None, None, None);
    for (name, value) in fields() {
        let kind = Known::of(name);
        match kind {
            // Written afresh from `body`.
            Known::ContentLength | Known::TransferEncoding => continue,
            Known::Other if is_cookie(name) => {
                cookies = true;
                continue;
            }
            // Origins that fold `_` into `-` would take these for framing.
            Known::Other if fields::framing_lookalike(name) => continue,
            _ if !strip.keep(name, kind) => continue,
            Known::MaxForwards => {
                // One number, once: a head the HTTP/1 parser would refuse is not sent.
                let Ok(n) = fields::max_forwards(value) else { continue };
                if std::mem::replace(&mut max_forwards, true) {
                    continue;
                }
                if decrement {
                    out.extend_from_slice(name);
                    out.extend_from_slice(b": ");
                    push_u64(out, u64::from(n.saturating_sub(1)));
                    out.extend_from_slice(b"\r\n");
                    continue;
                }
            }
            _ => {}
        }
        push_field(out, name, value);
        let end = Some((out.len() - 2, value));
        match kind {
            Known::Via if rw.via.is_some() => via = end,
            Known::XForwardedFor if rw.forwarded_for.is_some() => xff = end,
            Known::Forwarded if rw.forwarded_for.is_some() => fwd = end,
            _ => {}
        }
    }
    if cookies {
        out.extend_from_slice(b"cookie: ");
        let mut first = true;
        for (name, value) in fields() {
            // An empty crumb would leave a separator at the end, or two in a row.
            if !value.is_empty() && Known::of(name) == Known::Other && is_cookie(name) {
                if !std::mem::replace(&mut first, false) {
                    out.extend_from_slice(b"; ");
                }
                out.extend_from_slice(value);
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    let appended = Appended { via: via.is_some(), xff: xff.is_some(), fwd: fwd.is_some() };
    // The proxy's elements into the client's fields, the last in `out` first so that
    // the other positions stay where they are.
    let mut at = [via.map(|v| (v, 0)), xff.map(|v| (v, 1)), fwd.map(|v| (v, 2))];
    at.sort_unstable_by_key(|a| std::cmp::Reverse(a.map(|((end, _), _)| end)));
    for ((end, value), which) in at.into_iter().flatten() {
        let len = out.len();
        push_list_sep(out, value);
        match (which, rw.via, rw.forwarded_for) {
            (0, Some(v), _) => push_via(out, Received::Http2, v),
            (1, _, Some(addr)) => push_clean(out, addr, false),
            (2, _, Some(addr)) => push_forwarded_for(out, addr),
            _ => {}
        }
        let added = out.len() - len;
        out[end..].rotate_right(added);
    }
    push_added(out, rw, Received::Http2, appended);
    match body {
        BodyKind::Length(n) => {
            out.extend_from_slice(b"Content-Length: ");
            push_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        BodyKind::Chunked => push_field(out, b"Transfer-Encoding", b"chunked"),
        BodyKind::None | BodyKind::CloseDelimited => {}
    }
    out.extend_from_slice(b"\r\n");
}

fn is_cookie(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"cookie")
}

/// The fields of an HTTP/1.1 response head (`head`, parsed from `buf`) that an HTTP/2
/// client gets, in order: without the hop-by-hop ones (those a Connection field names
/// too) and the framing (Transfer-Encoding), Content-Length once with one value. With
/// `via`, the Via fields become one, the proxy's element last (`1.x <via>`), written into
/// `scratch` and given after the others.
pub fn h2_response_fields<'b>(
    head: &'b ResponseHead,
    buf: &'b [u8],
    via: Option<&str>,
    scratch: &'b mut Vec<u8>,
) -> impl Iterator<Item = (&'b [u8], &'b [u8])> + 'b {
    let strip = Strip::new(&head.headers, buf, &head.conn, false, false);
    let keep = move |h: &super::Header| {
        h.kind != Known::TransferEncoding && strip.keep(h.name.get(buf), h.kind)
    };
    scratch.clear();
    if let Some(v) = via {
        for h in head.headers.iter().filter(|h| h.kind == Known::Via && keep(h)) {
            let value = h.value.get(buf);
            if !value.is_empty() && !scratch.is_empty() {
                scratch.extend_from_slice(b", ");
            }
            scratch.extend_from_slice(value);
        }
        if !scratch.is_empty() {
            scratch.extend_from_slice(b", ");
        }
        push_via(scratch, Received::Http1 { minor: head.minor }, v);
    }
    let scratch: &'b [u8] = scratch;
    let combined = via.is_some();
    let mut length = false;
    head.headers
        .iter()
        .filter(move |h| keep(h) && !(combined && h.kind == Known::Via))
        .filter_map(move |h| {
            let mut value = h.value.get(buf);
            if h.kind == Known::ContentLength {
                if std::mem::replace(&mut length, true) {
                    return None;
                }
                // The parser checked that a list's elements are all the same number.
                let first = value.split(|&b| b == b',').next().unwrap_or_default();
                value = fields::trim_ows(first);
            }
            Some((h.name.get(buf), value))
        })
        .chain(combined.then_some((&b"via"[..], scratch)))
}

/// Whether a trailer field goes on between HTTP/1.1 and HTTP/2 (either way): not one
/// that must not be a trailer ([`is_dropped_trailer`]), nor one of those the proxy
/// writes itself (Via, X-Forwarded-For, Forwarded), nor a framing name spelt with an
/// underscore.
pub fn is_h2_trailer_kept(name: &[u8]) -> bool {
    !is_dropped_trailer(name)
        && match Known::of(name) {
            Known::Via | Known::XForwardedFor | Known::Forwarded => false,
            Known::Other => !fields::framing_lookalike(name),
            _ => true,
        }
}
