//! HTTP/1.1 message heads: parsing (strict, RFC 9112) and rewriting for
//! forwarding.
//!
//! Parsed heads never copy bytes: every piece of text is a [`Span`] into the
//! buffer that was passed to the parser, so the caller must keep that buffer
//! (unchanged) for as long as it uses the head.

mod error;
mod fields;
mod h2;
mod hop;
mod parse;
mod target;
mod write;

#[cfg(test)]
mod tests_h2;
#[cfg(test)]
mod tests_request;
#[cfg(test)]
mod tests_response;
#[cfg(test)]
mod tests_write;

pub use error::HeadError;
pub(crate) use fields::is_tchar;
pub use h2::{h2_response_fields, is_h2_trailer_kept, write_h2_request, H2Request};
pub use hop::{rewrite_for_hop, NextHop};
pub use parse::{parse_request, parse_response};
pub use write::{
    push_decimal, write_connect, write_request, write_response, RequestRewrite, ResponseRewrite,
};

/// A byte range into the head buffer. u32 keeps heads small; heads are capped far below 4 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    /// The bytes of this span in `buf`. Returns an empty slice instead of
    /// panicking when the span does not fit `buf` (i.e. the wrong buffer was
    /// passed), because a panic here would take down a proxy worker.
    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        buf.get(self.start as usize..self.end as usize).unwrap_or(&[])
    }

    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Request method. Extension methods are `Other`; their text is in
/// `RequestHead::method_span`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Connect,
    Options,
    Trace,
    Patch,
    Other,
}

impl Method {
    /// Methods are case-sensitive (RFC 9110 9.1): `get` is an extension
    /// method, not GET.
    pub(crate) fn from_bytes(b: &[u8]) -> Method {
        match b {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"CONNECT" => Method::Connect,
            b"OPTIONS" => Method::Options,
            b"TRACE" => Method::Trace,
            b"PATCH" => Method::Patch,
            _ => Method::Other,
        }
    }

    /// RFC 9110 9.2.2: a request with an idempotent method may be sent again when its
    /// connection failed before any answer came; any other may already have had its effect,
    /// and a proxy must not repeat it on its own.
    pub fn is_idempotent(self) -> bool {
        match self {
            Method::Get
            | Method::Head
            | Method::Put
            | Method::Delete
            | Method::Options
            | Method::Trace => true,
            Method::Post | Method::Connect | Method::Patch | Method::Other => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
    /// `ws://`, as WebSocket clients (aiohttp) send it to an HTTP proxy: the origin is
    /// asked as for `http://`. Only in upgrade requests (the parser refuses it otherwise).
    Ws,
    /// `wss://`: as `https://` (TLS to the origin), only in upgrade requests.
    Wss,
}

impl Scheme {
    /// Whether the origin is reached over TLS.
    pub fn is_tls(self) -> bool {
        matches!(self, Scheme::Https | Scheme::Wss)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// absolute-form `http://host[:port][/path][?query]`. `host` excludes IPv6
    /// brackets; `authority` is `host[:port]` exactly as written (with
    /// brackets), for the Host header; `path` is the path+query (may be
    /// empty, which means "/" when written, and may start with `?` when the
    /// target had a query but no path, in which case the writer puts a "/"
    /// in front); port defaults to 80 for http and ws, 443 for https and wss.
    Absolute { scheme: Scheme, host: Span, port: u16, authority: Span, path: Span },
    /// authority-form `host:port` (CONNECT only); port is required; host excludes brackets.
    Authority { host: Span, port: u16, authority: Span },
    /// origin-form `/path?query`
    Origin { path: Span },
    /// `*` (OPTIONS only)
    Asterisk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    None,
    Length(u64),
    Chunked,
    /// responses only: body ends when the origin closes
    CloseDelimited,
}

/// One header field line; both spans index the parsed buffer. The value has
/// leading and trailing whitespace removed (httparse does that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub name: Span,
    pub value: Span,
    /// What the name is, found once by the parser for the writer to reuse.
    pub(crate) kind: fields::Known,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Maximum head size in bytes (default 64 KiB). Clamped to `u32::MAX`
    /// because spans are u32.
    pub max_head: usize,
    /// Maximum number of header fields (default 128). Values above 256 are
    /// treated as 256: the parser's scratch array lives on the stack.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_head: 64 * 1024, max_headers: 128 }
    }
}

/// Tokens seen in the Connection header(s) (and Proxy-Connection for requests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnFlags {
    pub close: bool,
    pub keep_alive: bool,
    pub upgrade: bool,
    /// A Connection field names an option besides these three, whose fields are then
    /// hop-by-hop too (almost never: the writer looks them up only when set).
    pub(crate) nominates: bool,
}

#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: Method,
    pub method_span: Span,
    pub target: Target,
    pub target_span: Span,
    /// HTTP/1.x minor version, 0 or 1
    pub minor: u8,
    /// bytes of the head including the final CRLFCRLF (and any skipped
    /// leading empty lines)
    pub len: usize,
    /// all header fields in order (reused between requests)
    pub headers: Vec<Header>,
    /// None, Length or Chunked (never CloseDelimited for requests)
    pub body: BodyKind,
    pub conn: ConnFlags,
    /// value of the Upgrade header, if any
    pub upgrade: Option<Span>,
    /// Expect: 100-continue
    pub expect_continue: bool,
    pub max_forwards: Option<u32>,
    /// value of the Host header
    pub host: Option<Span>,
    /// Content-Length came as a list or repeated (see `write_request`).
    pub(crate) length_list: bool,
}

impl Default for RequestHead {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestHead {
    pub fn new() -> Self {
        RequestHead {
            method: Method::Get,
            method_span: Span::default(),
            target: Target::Origin { path: Span::default() },
            target_span: Span::default(),
            minor: 1,
            len: 0,
            headers: Vec::new(),
            body: BodyKind::None,
            conn: ConnFlags::default(),
            upgrade: None,
            expect_continue: false,
            max_forwards: None,
            host: None,
            length_list: false,
        }
    }

    /// Whether the client wants the connection kept open after this
    /// exchange: HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with
    /// `Connection: keep-alive`.
    pub fn keep_alive(&self) -> bool {
        if self.conn.close {
            return false;
        }
        self.minor >= 1 || self.conn.keep_alive
    }

    /// true when the request asks for a protocol upgrade (Upgrade header
    /// present and `upgrade` token in Connection). Always false for HTTP/1.0
    /// because RFC 9110 7.8 says Upgrade in a 1.0 request must be ignored.
    pub fn is_upgrade(&self) -> bool {
        self.minor >= 1 && self.conn.upgrade && self.upgrade.is_some()
    }

    /// value of a header by case-insensitive name (first occurrence)
    pub fn header<'a>(&self, buf: &'a [u8], name: &str) -> Option<&'a [u8]> {
        find_header(&self.headers, buf, name)
    }

    /// Reset every field so a parse failure never leaves data from the
    /// previous request behind; keeps the `headers` allocation.
    pub(crate) fn reset(&mut self) {
        let mut headers = std::mem::take(&mut self.headers);
        headers.clear();
        *self = RequestHead { headers, ..RequestHead::new() };
    }
}

#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub status: u16,
    pub minor: u8,
    pub reason: Span,
    pub len: usize,
    pub headers: Vec<Header>,
    /// computed with the request method (RFC 9112 6.3)
    pub body: BodyKind,
    pub conn: ConnFlags,
    pub upgrade: Option<Span>,
    /// Content-Length came as a list or repeated (see `write_response`).
    pub(crate) length_list: bool,
}

impl Default for ResponseHead {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseHead {
    pub fn new() -> Self {
        ResponseHead {
            status: 0,
            minor: 1,
            reason: Span::default(),
            len: 0,
            headers: Vec::new(),
            body: BodyKind::None,
            conn: ConnFlags::default(),
            upgrade: None,
            length_list: false,
        }
    }

    /// Whether the origin connection may be reused after this response:
    /// persistent per version and Connection, and never when the body is
    /// delimited by the origin closing.
    pub fn keep_alive(&self) -> bool {
        if self.conn.close || self.body == BodyKind::CloseDelimited {
            return false;
        }
        self.minor >= 1 || self.conn.keep_alive
    }

    /// value of a header by case-insensitive name (first occurrence)
    pub fn header<'a>(&self, buf: &'a [u8], name: &str) -> Option<&'a [u8]> {
        find_header(&self.headers, buf, name)
    }

    pub(crate) fn reset(&mut self) {
        let mut headers = std::mem::take(&mut self.headers);
        headers.clear();
        *self = ResponseHead { headers, ..ResponseHead::new() };
    }
}

fn find_header<'a>(headers: &[Header], buf: &'a [u8], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.get(buf).eq_ignore_ascii_case(name.as_bytes()))
        .map(|h| h.value.get(buf))
}
