//! Head rejection reasons.

/// Why a head was rejected. `status()` gives the HTTP status the proxy
/// should answer a client with (response errors are mapped to 502 by the
/// proxy itself). Display is a short one-line lowercase reason suitable for a
/// response body and a log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadError {
    #[error("head too large")]
    HeadTooLarge,
    #[error("too many header fields")]
    TooManyHeaders,
    #[error("bare cr in head")]
    BareCr,
    #[error("bare lf line ending in head")]
    BareLf,
    #[error("malformed start line")]
    MalformedStartLine,
    #[error("invalid method")]
    InvalidMethod,
    #[error("invalid request target")]
    InvalidTarget,
    #[error("invalid character in request target")]
    InvalidTargetChar,
    #[error("fragment in request target")]
    Fragment,
    #[error("unsupported scheme in request target")]
    UnsupportedScheme,
    #[error("ws:// and wss:// targets are only for a websocket upgrade")]
    WebSocketWithoutUpgrade,
    #[error("empty host in request target")]
    EmptyHost,
    #[error("invalid host in request target")]
    InvalidHost,
    #[error("userinfo in request target")]
    Userinfo,
    #[error("invalid port in request target")]
    InvalidPort,
    #[error("missing port in connect target")]
    MissingPort,
    #[error("connect requires an authority-form target")]
    ConnectNeedsAuthority,
    #[error("authority-form target is only allowed with connect")]
    AuthorityFormNotConnect,
    #[error("asterisk target is only allowed with options")]
    AsteriskNotOptions,
    #[error("malformed http version")]
    InvalidVersion,
    #[error("unsupported http version")]
    UnsupportedVersion,
    #[error("invalid response status")]
    InvalidStatus,
    #[error("invalid header field name")]
    InvalidHeaderName,
    #[error("whitespace between header field name and colon")]
    WhitespaceBeforeColon,
    #[error("obsolete line folding in header")]
    ObsFold,
    #[error("invalid header field value")]
    InvalidHeaderValue,
    #[error("both content-length and transfer-encoding present")]
    ContentLengthAndTransferEncoding,
    #[error("invalid content-length")]
    InvalidContentLength,
    #[error("conflicting content-length values")]
    ConflictingContentLength,
    #[error("content-length too large")]
    ContentLengthTooLarge,
    #[error("malformed transfer-encoding")]
    InvalidTransferEncoding,
    #[error("transfer-encoding does not end in chunked")]
    NotChunked,
    #[error("chunked applied more than once")]
    ChunkedTwice,
    #[error("transfer-encoding in an http/1.0 message")]
    TransferEncodingHttp10,
    #[error("request transfer coding other than chunked is not implemented")]
    TransferCodingNotImplemented,
    /// `Transfer_Encoding` or `Content_Length`: a field servers that fold `_` into `-`
    /// (CGI and its heirs) would take for framing that this message does not have.
    #[error("a framing field name spelled with an underscore")]
    FramingFieldUnderscore,
    #[error("connection header names a framing field")]
    ConnectionNamesFraming,
    #[error("multiple host headers")]
    MultipleHost,
    #[error("missing host header")]
    MissingHost,
    #[error("invalid host header")]
    InvalidHostHeader,
    #[error("invalid max-forwards")]
    InvalidMaxForwards,
    #[error("multiple max-forwards headers")]
    MultipleMaxForwards,
}

impl HeadError {
    /// The status to answer a client whose request head failed to parse.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::HeadTooLarge | HeadError::TooManyHeaders => 431,
            HeadError::UnsupportedVersion => 505,
            HeadError::ContentLengthTooLarge => 413,
            // RFC 9112 6.1: a transfer coding the server does not understand.
            HeadError::TransferCodingNotImplemented => 501,
            _ => 400,
        }
    }
}
