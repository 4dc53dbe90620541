//! Per-field semantics shared by the request and response parsers: message
//! framing (Content-Length / Transfer-Encoding), Connection tokens, Host and
//! Max-Forwards. Every ambiguity is an error, never a guess (RFC 9112 6.3).

use super::{ConnFlags, HeadError};
use crate::MAX_LENGTH;

/// Well-known field names the parsers and writers care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    ContentLength,
    TransferEncoding,
    Connection,
    ProxyConnection,
    KeepAlive,
    ProxyAuthorization,
    ProxyAuthenticate,
    Te,
    Trailer,
    Upgrade,
    Host,
    Expect,
    MaxForwards,
    Via,
    XForwardedFor,
    Forwarded,
    /// A field named like the `close` connection option (a name RFC 9110 16.3.2.2
    /// reserves for that reason): hop-by-hop when Connection says close.
    Close,
    Other,
}

impl Known {
    /// Classify a field name (case-insensitive). Dispatching on the length
    /// first keeps this to at most two comparisons per field.
    pub(crate) fn of(name: &[u8]) -> Known {
        // The first byte turns most other names away before a whole comparison.
        let first = name.first().map_or(0, u8::to_ascii_lowercase);
        let eq = |s: &[u8]| first == s[0] && name.eq_ignore_ascii_case(s);
        match name.len() {
            2 if eq(b"te") => Known::Te,
            3 if eq(b"via") => Known::Via,
            4 if eq(b"host") => Known::Host,
            5 if eq(b"close") => Known::Close,
            6 if eq(b"expect") => Known::Expect,
            7 if eq(b"trailer") => Known::Trailer,
            7 if eq(b"upgrade") => Known::Upgrade,
            9 if eq(b"forwarded") => Known::Forwarded,
            10 if eq(b"connection") => Known::Connection,
            10 if eq(b"keep-alive") => Known::KeepAlive,
            12 if eq(b"max-forwards") => Known::MaxForwards,
            14 if eq(b"content-length") => Known::ContentLength,
            15 if eq(b"x-forwarded-for") => Known::XForwardedFor,
            16 if eq(b"proxy-connection") => Known::ProxyConnection,
            17 if eq(b"transfer-encoding") => Known::TransferEncoding,
            18 if eq(b"proxy-authenticate") => Known::ProxyAuthenticate,
            19 if eq(b"proxy-authorization") => Known::ProxyAuthorization,
            _ => Known::Other,
        }
    }
}

/// Whether `name` is `content-length` or `transfer-encoding` with an underscore for a
/// dash (any case). Called only for names of neither kind, so the lengths turn almost
/// every name away before a comparison.
pub(crate) fn framing_lookalike(name: &[u8]) -> bool {
    let like = |s: &[u8]| {
        name.len() == s.len()
            && name.contains(&b'_')
            && name.iter().zip(s).all(|(&a, &b)| {
                let a = if a == b'_' { b'-' } else { a.to_ascii_lowercase() };
                a == b
            })
    };
    like(b"content-length") || like(b"transfer-encoding")
}

/// Framing facts gathered over all header fields of one message.
#[derive(Debug, Default)]
pub(crate) struct Framing {
    pub content_length: Option<u64>,
    pub te_seen: bool,
    /// Transfer-Encoding fields, and codings over all of them.
    te_fields: u32,
    codings: u32,
    chunked_count: u32,
    last_is_chunked: bool,
    /// Content-Length values, over every field and list element.
    length_values: u32,
}

impl Framing {
    /// Content-Length = 1*DIGIT; a comma list (or repeated field) is
    /// accepted only when every element is the same number (RFC 9110 8.6),
    /// at most [`MAX_LENGTH`].
    pub(crate) fn content_length(&mut self, value: &[u8]) -> Result<(), HeadError> {
        for elem in value.split(|&b| b == b',') {
            self.length_values += 1;
            let n = parse_digits(trim_ows(elem)).ok_or(HeadError::InvalidContentLength)?;
            if n > MAX_LENGTH {
                return Err(HeadError::ContentLengthTooLarge);
            }
            match self.content_length {
                Some(prev) if prev != n => return Err(HeadError::ConflictingContentLength),
                _ => self.content_length = Some(n),
            }
        }
        Ok(())
    }

    /// A Content-Length field whose value framing ignores (a 2xx to CONNECT): counted so
    /// that the writer looks at it, whatever it holds.
    pub(crate) fn unchecked_length(&mut self) {
        self.length_values += 2;
    }

    /// Content-Length came as a list or in several fields (of one value, checked), or
    /// was not checked: the writers then send it once, with one value.
    pub(crate) fn length_list(&self) -> bool {
        self.length_values > 1
    }

    /// Transfer-Encoding is a list of transfer-codings, possibly spread over
    /// several fields; only the final coding matters for framing, and it
    /// must be `chunked`, exactly once.
    pub(crate) fn transfer_encoding(&mut self, value: &[u8]) -> Result<(), HeadError> {
        self.te_seen = true;
        self.te_fields += 1;
        for elem in value.split(|&b| b == b',') {
            let coding = trim_ows(elem);
            self.codings += 1;
            // Parameters and empty elements are rejected: no coding the
            // proxy relays needs them, and they are smuggling favourites.
            if coding.is_empty() || !coding.iter().all(|&b| is_tchar(b)) {
                return Err(HeadError::InvalidTransferEncoding);
            }
            self.last_is_chunked = coding.eq_ignore_ascii_case(b"chunked");
            if self.last_is_chunked {
                self.chunked_count += 1;
            }
        }
        Ok(())
    }

    /// A request's framing once `finish` passed it: a Transfer-Encoding must be one field
    /// of one coding, `chunked` (in any case). Any other coding before it (`gzip,
    /// chunked`, `identity, chunked`, the same over two fields) is one rustle would pass
    /// on without applying or removing it, for a next hop to read its own way: refused
    /// (501) rather than forwarded.
    pub(crate) fn finish_request(&self) -> Result<(), HeadError> {
        if self.te_seen && (self.te_fields != 1 || self.codings != 1) {
            return Err(HeadError::TransferCodingNotImplemented);
        }
        Ok(())
    }

    /// Checks that need every field seen. `minor` is the HTTP/1.x version.
    pub(crate) fn finish(&self, minor: u8) -> Result<(), HeadError> {
        if !self.te_seen {
            return Ok(());
        }
        // RFC 9112 6.1: Transfer-Encoding in a 1.0 message means faulty
        // framing.
        if minor == 0 {
            return Err(HeadError::TransferEncodingHttp10);
        }
        if self.content_length.is_some() {
            return Err(HeadError::ContentLengthAndTransferEncoding);
        }
        if self.chunked_count > 1 {
            return Err(HeadError::ChunkedTwice);
        }
        if !self.last_is_chunked {
            return Err(HeadError::NotChunked);
        }
        Ok(())
    }
}

/// Record the tokens of one Connection (or, with `nominating` false,
/// Proxy-Connection) field. A Connection header that nominates Content-Length
/// or Transfer-Encoding would make a hop-by-hop-stripping proxy drop the
/// framing of a body it still forwards, so such messages are rejected.
pub(crate) fn connection(
    value: &[u8],
    nominating: bool,
    flags: &mut ConnFlags,
) -> Result<(), HeadError> {
    for tok in tokens(value) {
        if tok.eq_ignore_ascii_case(b"close") {
            flags.close = true;
        } else if tok.eq_ignore_ascii_case(b"keep-alive") {
            flags.keep_alive = true;
        } else if tok.eq_ignore_ascii_case(b"upgrade") {
            flags.upgrade = true;
        } else if matches!(Known::of(tok), Known::ContentLength | Known::TransferEncoding) {
            return Err(HeadError::ConnectionNamesFraming);
        } else {
            flags.nominates |= nominating;
        }
    }
    Ok(())
}

/// Non-empty, OWS-trimmed elements of a comma-separated list.
pub(crate) fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(trim_ows).filter(|t| !t.is_empty())
}

/// Max-Forwards = 1*DIGIT. Values above u32::MAX are still numbers, so they
/// saturate instead of failing.
pub(crate) fn max_forwards(value: &[u8]) -> Result<u32, HeadError> {
    let v = trim_ows(value);
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return Err(HeadError::InvalidMaxForwards);
    }
    Ok(v.iter().fold(0u32, |acc, &b| acc.saturating_mul(10).saturating_add(u32::from(b - b'0'))))
}

/// `Expect: 100-continue` (case-insensitive per RFC 9110 10.1.1).
pub(crate) fn is_100_continue(value: &[u8]) -> bool {
    trim_ows(value).eq_ignore_ascii_case(b"100-continue")
}

/// 1*DIGIT without overflow; None for empty, non-digit or too large.
fn parse_digits(d: &[u8]) -> Option<u64> {
    if d.is_empty() {
        return None;
    }
    d.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// RFC 9110 5.6.2 tchar.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}
