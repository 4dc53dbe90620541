//! Request and response head parsers: `httparse` does the tokenizing, this
//! module adds what httparse leaves to the caller (line-ending strictness,
//! framing, target forms, Host rules) and turns its terse errors into
//! specific [`HeadError`]s.
//!
//! Leading empty lines before the start line are skipped (RFC 9112 2.2
//! allows it) when they are CRLF; `len` includes them and all spans index
//! the original buffer. Bare-LF empty lines are rejected like any bare LF.

use super::fields::{self, Framing, Known};
use super::target::{parse_authority, parse_target};
use super::{
    BodyKind, HeadError, Header, Limits, Method, RequestHead, ResponseHead, Scheme, Span, Target,
};
use std::mem::MaybeUninit;

/// Size of the stack scratch array for httparse; `Limits::max_headers` is
/// clamped to it so the parser never needs the heap.
const MAX_HEADERS: usize = 256;

/// Spans are u32, so no head may be longer than this.
const MAX_SPAN: usize = u32::MAX as usize;

/// Ok(Some(())) = a complete head was parsed into `head`; Ok(None) = need
/// more bytes (only when `buf.len() < limits.max_head`; a full buffer
/// without a complete head is [`HeadError::HeadTooLarge`]). On error the
/// contents of `head` are unspecified.
pub fn parse_request(
    buf: &[u8],
    limits: &Limits,
    head: &mut RequestHead,
) -> Result<Option<()>, HeadError> {
    head.reset();
    let cap = limits.max_head.min(MAX_SPAN);
    let win = &buf[..buf.len().min(cap)];
    let mut scratch = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let n = limits.max_headers.min(MAX_HEADERS);
    let mut req = httparse::Request::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        win,
        &mut scratch[..n],
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= cap => return Err(HeadError::HeadTooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(diagnose(win, e, true)),
    };
    let head_bytes = win.get(..len).unwrap_or(win);
    check_line_endings(head_bytes)?;
    // httparse fills all three before reporting Complete.
    let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::MalformedStartLine);
    };
    head.len = len;
    head.minor = minor;
    head.method = Method::from_bytes(method.as_bytes());
    head.method_span = span_of(win, method.as_bytes());
    head.target_span = span_of(win, path.as_bytes());
    head.target = parse_target(win, head.target_span, head.method)?;

    let mut framing = Framing::default();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        let kind = Known::of(name);
        let field = Header { name: span_of(win, name), value: span_of(win, value), kind };
        head.headers.push(field);
        match kind {
            Known::ContentLength => framing.content_length(value)?,
            Known::TransferEncoding => framing.transfer_encoding(value)?,
            Known::Other if fields::framing_lookalike(name) => {
                return Err(HeadError::FramingFieldUnderscore)
            }
            // Proxy-Connection is non-standard but old clients still send
            // it to proxies instead of Connection.
            Known::Connection => fields::connection(value, true, &mut head.conn)?,
            Known::ProxyConnection => fields::connection(value, false, &mut head.conn)?,
            Known::Upgrade if head.upgrade.is_none() => head.upgrade = Some(field.value),
            Known::Host => {
                // RFC 9112 3.2: more than one Host, or an invalid one, is a 400.
                if head.host.is_some() {
                    return Err(HeadError::MultipleHost);
                }
                // An empty Host is legal when the target has no authority; one
                // that repeats the target's authority was checked with it.
                let repeats = matches!(head.target,
                    Target::Absolute { authority, .. } if authority.get(win) == value);
                if !value.is_empty() && !repeats && parse_authority(value, false).is_err() {
                    return Err(HeadError::InvalidHostHeader);
                }
                head.host = Some(field.value);
            }
            Known::Expect if fields::is_100_continue(value) => head.expect_continue = true,
            Known::MaxForwards => {
                if head.max_forwards.is_some() {
                    return Err(HeadError::MultipleMaxForwards);
                }
                head.max_forwards = Some(fields::max_forwards(value)?);
            }
            _ => {}
        }
    }
    framing.finish(minor)?;
    framing.finish_request()?;
    head.length_list = framing.length_list();
    if minor == 1 && head.host.is_none() {
        return Err(HeadError::MissingHost);
    }
    if matches!(head.target, Target::Absolute { scheme: Scheme::Ws | Scheme::Wss, .. })
        && !head.is_upgrade()
    {
        return Err(HeadError::WebSocketWithoutUpgrade);
    }
    head.body = if framing.te_seen {
        BodyKind::Chunked
    } else if let Some(n) = framing.content_length {
        BodyKind::Length(n)
    } else {
        BodyKind::None
    };
    Ok(Some(()))
}

/// Same for an origin's response to a request with method `req_method`.
/// Body rules follow RFC 9112 6.3; a Transfer-Encoding whose final coding is
/// not chunked is rejected instead of treated as close-delimited.
pub fn parse_response(
    buf: &[u8],
    limits: &Limits,
    req_method: Method,
    head: &mut ResponseHead,
) -> Result<Option<()>, HeadError> {
    head.reset();
    let cap = limits.max_head.min(MAX_SPAN);
    let win = &buf[..buf.len().min(cap)];
    let mut scratch = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let n = limits.max_headers.min(MAX_HEADERS);
    let mut res = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        win,
        &mut scratch[..n],
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= cap => return Err(HeadError::HeadTooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(diagnose(win, e, false)),
    };
    let head_bytes = win.get(..len).unwrap_or(win);
    check_line_endings(head_bytes)?;
    let (Some(minor), Some(status)) = (res.version, res.code) else {
        return Err(HeadError::MalformedStartLine);
    };
    // httparse takes any three digits; status codes start at 100.
    if status < 100 {
        return Err(HeadError::InvalidStatus);
    }
    head.len = len;
    head.minor = minor;
    head.status = status;
    head.reason = reason_span(head_bytes);

    // RFC 9112 6.3 rule 2: a 2xx to CONNECT switches to a tunnel and its
    // framing fields must be ignored, so they are not even validated.
    let tunnel = req_method == Method::Connect && (200..300).contains(&status);
    let mut framing = Framing::default();
    for h in res.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        let kind = Known::of(name);
        let field = Header { name: span_of(win, name), value: span_of(win, value), kind };
        head.headers.push(field);
        match kind {
            Known::ContentLength if !tunnel => framing.content_length(value)?,
            // Ignored for framing, but still sent on once (`write_response`).
            Known::ContentLength => framing.unchecked_length(),
            Known::TransferEncoding if !tunnel => framing.transfer_encoding(value)?,
            Known::Connection => fields::connection(value, true, &mut head.conn)?,
            Known::Upgrade if head.upgrade.is_none() => head.upgrade = Some(field.value),
            _ => {}
        }
    }
    // Framing is validated even for bodiless responses (HEAD, 204, 304):
    // a malformed one says the origin cannot be trusted to frame anything.
    framing.finish(minor)?;
    head.length_list = framing.length_list();
    head.body =
        if tunnel || req_method == Method::Head || status < 200 || status == 204 || status == 304 {
            BodyKind::None
        } else if framing.te_seen {
            BodyKind::Chunked
        } else if let Some(n) = framing.content_length {
            BodyKind::Length(n)
        } else {
            BodyKind::CloseDelimited
        };
    Ok(Some(()))
}

/// Span of `sub`, which httparse returned as a sub-slice of `base`. The
/// range check cannot fail for httparse output; it only keeps a broken
/// assumption from producing a span that points elsewhere.
fn span_of(base: &[u8], sub: &[u8]) -> Span {
    let start = (sub.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    match start.checked_add(sub.len()) {
        // base.len() <= MAX_SPAN, so both fit in u32.
        Some(end) if end <= base.len() => Span { start: start as u32, end: end as u32 },
        _ => Span::default(),
    }
}

/// RFC 9112 2.2: only CRLF ends a line. httparse accepts bare LF (and a
/// proxy that accepts what its origin rejects, or vice versa, is how
/// smuggling starts), so every CR must be followed by LF and every LF
/// preceded by CR. A CR as the very last byte may still get its LF.
fn check_line_endings(bytes: &[u8]) -> Result<(), HeadError> {
    match crlf_only(bytes) {
        true => Ok(()),
        false => line_ending_fault(bytes),
    }
}

/// The byte-by-byte form of the same rule, run only to name the fault (or to
/// allow a last CR that waits for its LF).
fn line_ending_fault(bytes: &[u8]) -> Result<(), HeadError> {
    let mut prev = 0u8;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' && prev != b'\r' {
            return Err(HeadError::BareLf);
        }
        if b == b'\r' && bytes.get(i + 1).is_some_and(|&n| n != b'\n') {
            return Err(HeadError::BareCr);
        }
        prev = b;
    }
    Ok(())
}

/// Every CR starts a CRLF and every LF ends one: exactly when each byte is a
/// CR just where the next is an LF, and the bytes neither start with LF nor
/// end with CR. Branch-free, so that it vectorizes.
fn crlf_only(bytes: &[u8]) -> bool {
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else { return true };
    let mismatch = bytes
        .iter()
        .zip(&bytes[1..])
        .fold(0u8, |acc, (&a, &b)| acc | (u8::from(a == b'\r') ^ u8::from(b == b'\n')));
    mismatch == 0 && first != b'\n' && last != b'\r'
}

/// The reason phrase of a complete, line-ending-checked response head:
/// after `HTTP/1.x NNN ` up to the CR (empty when there is no SP).
fn reason_span(head: &[u8]) -> Span {
    let start = head.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
    // "HTTP/1.x NNN" is exactly 12 bytes (httparse checked it).
    let after_code = start + 12;
    let from = if head.get(after_code) == Some(&b' ') { after_code + 1 } else { after_code };
    let rest = head.get(from..).unwrap_or(&[]);
    let to = from + rest.iter().position(|&b| b == b'\r').unwrap_or(0);
    // head.len() <= MAX_SPAN
    Span { start: from.min(to) as u32, end: to as u32 }
}

/// Map an httparse error to the most specific cause. Runs only on the
/// error path, so it may re-scan the head.
fn diagnose(win: &[u8], e: httparse::Error, request: bool) -> HeadError {
    let end = win.windows(4).position(|w| w == b"\r\n\r\n").map_or(win.len(), |i| i + 4);
    let region = &win[..end];
    if let Err(le) = check_line_endings(region) {
        return le;
    }
    let mut lines = region
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .skip_while(|l| l.is_empty());
    let start_line = lines.next().unwrap_or(&[]);
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        httparse::Error::Version => version_error(start_line, request),
        httparse::Error::Token => {
            let method = start_line.split(|&b| b == b' ').next().unwrap_or(&[]);
            if method.is_empty() || !method.iter().all(|&b| fields::is_tchar(b)) {
                HeadError::InvalidMethod
            } else {
                HeadError::InvalidTarget
            }
        }
        httparse::Error::Status => HeadError::InvalidStatus,
        httparse::Error::NewLine => HeadError::MalformedStartLine,
        httparse::Error::HeaderValue => HeadError::InvalidHeaderValue,
        httparse::Error::HeaderName => {
            for line in lines.take_while(|l| !l.is_empty()) {
                if let Some(err) = header_line_error(line) {
                    return err;
                }
            }
            HeadError::InvalidHeaderName
        }
    }
}

/// `HTTP/<digit>...` that is not 1.0/1.1 is a version we do not speak (505);
/// anything else is a malformed start line.
fn version_error(start_line: &[u8], request: bool) -> HeadError {
    let mut parts = start_line.split(|&b| b == b' ');
    let version = if request {
        let (_, _, v, extra) = (parts.next(), parts.next(), parts.next(), parts.next());
        if extra.is_some() {
            return HeadError::MalformedStartLine;
        }
        v
    } else {
        parts.next()
    };
    match version {
        Some([b'H', b'T', b'T', b'P', b'/', d, ..]) if d.is_ascii_digit() => {
            HeadError::UnsupportedVersion
        }
        _ => HeadError::InvalidVersion,
    }
}

fn header_line_error(line: &[u8]) -> Option<HeadError> {
    if matches!(line.first(), Some(b' ' | b'\t')) {
        return Some(HeadError::ObsFold);
    }
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Some(HeadError::InvalidHeaderName);
    };
    let name = &line[..colon];
    if matches!(name.last(), Some(b' ' | b'\t')) {
        return Some(HeadError::WhitespaceBeforeColon);
    }
    if name.is_empty() || !name.iter().all(|&b| fields::is_tchar(b)) {
        return Some(HeadError::InvalidHeaderName);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast check says yes exactly when the byte loop finds no fault, except for
    /// a CR at the very end, which only the loop lets wait for its LF.
    #[test]
    fn crlf_only_agrees_with_the_byte_loop() {
        let alphabet = [b'\r', b'\n', b'a'];
        for len in 0..=7u32 {
            for mut code in 0..3usize.pow(len) {
                let mut bytes = Vec::new();
                for _ in 0..len {
                    bytes.push(alphabet[code % 3]);
                    code /= 3;
                }
                let loop_ok = line_ending_fault(&bytes).is_ok();
                let fast = crlf_only(&bytes);
                let want = loop_ok && bytes.last() != Some(&b'\r');
                assert_eq!(fast, want, "{bytes:?}");
            }
        }
    }
}
