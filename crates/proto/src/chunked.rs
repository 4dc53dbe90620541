//! Validating pass-through scanner for `Transfer-Encoding: chunked` bodies
//! (RFC 9112 7.1).
//!
//! The proxy forwards chunked bytes as received; this finds where the body
//! ends and rejects malformed framing, so that the proxy and the next hop
//! can never disagree on where the message stops. It also says which bytes
//! not to forward: trailer fields that must not be trailers
//! ([`is_dropped_trailer`]) and, when de-chunking ([`Scanner::dechunk`]), all
//! framing. It keeps a few integers of state and gives the same verdict and
//! the same forwarded bytes however its input is split.

#[cfg(test)]
mod tests;

// Extension and trailer names are tokens, same as header field names.
use crate::http::is_tchar;
use crate::MAX_LENGTH;

/// Longest accepted chunk-size line (size + extensions, without CRLF).
const MAX_LINE: usize = 4096;
/// Largest accepted trailer section, including its final CRLF.
const MAX_TRAILERS: usize = 64 * 1024;
/// 16 hex digits fill a u64; more can only be padding abuse (the value itself is
/// bounded by [`MAX_LENGTH`]).
const MAX_SIZE_DIGITS: u8 = 16;
/// The longest name [`is_dropped_trailer`] drops: a trailer line is judged once this
/// many bytes of its name (and one more) are in.
const MAX_DROPPED_NAME: usize = 19;

/// Whether a field must not be forwarded in a trailer section. RFC 9110 6.5.1 forbids
/// trailers that are needed before the content is processed: RFC 7230 4.1.2 named the
/// classes (framing, routing, request modifiers, authentication, response control data,
/// how to process the content), listed here by the fields that RFC 9110 defines in each,
/// plus the fields that describe a connection rather than a message (RFC 9110 7.6.1).
/// A recipient that merged one of them into the header section would let the body's
/// sender rewrite the head after the fact; no honest sender puts them there.
pub fn is_dropped_trailer(name: &[u8]) -> bool {
    if name.len() > MAX_DROPPED_NAME {
        return false;
    }
    let mut lower = [0u8; MAX_DROPPED_NAME];
    let lower = &mut lower[..name.len()];
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    matches!(
        &*lower,
        // framing
        b"content-length" | b"transfer-encoding" | b"trailer"
        // routing
        | b"host"
        // request modifiers: controls and conditionals
        | b"cache-control" | b"expect" | b"max-forwards" | b"pragma" | b"range" | b"te"
        | b"if-match" | b"if-none-match" | b"if-modified-since" | b"if-unmodified-since"
        | b"if-range"
        // authentication, and cookies (RFC 6265)
        | b"authorization" | b"proxy-authorization" | b"www-authenticate"
        | b"proxy-authenticate" | b"cookie" | b"set-cookie"
        // response control data
        | b"age" | b"expires" | b"date" | b"location" | b"retry-after" | b"vary"
        | b"warning"
        // how to process the content
        | b"content-encoding" | b"content-type" | b"content-range"
        // the connection, not the message
        | b"connection" | b"keep-alive" | b"proxy-connection" | b"upgrade"
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    /// Start of a chunk-size line: a hex digit must follow.
    #[default]
    ExpectSize,
    InSize,
    /// Whitespace after the size: only more BWS then `;` may follow.
    SizeWs,
    /// After `;`: BWS then an extension name.
    ExtNameStart,
    ExtName,
    /// BWS after a name: `=`, `;` or more BWS.
    ExtNameWs,
    /// After `=`: BWS then a token or quoted-string.
    ExtValStart,
    ExtToken,
    ExtQuoted,
    ExtQuotedPair,
    /// Right after a closing quote: CR, `;` or BWS.
    ExtAfterQuoted,
    /// BWS after a value: only `;` or more BWS.
    ExtValWs,
    /// CR of the size line seen.
    ExpectLf,
    /// `size` data bytes remain.
    Data,
    ExpectDataCr,
    ExpectDataLf,
    /// Start of a trailer line (or of the final empty line).
    TrailerStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    FinalLf,
    Done,
}

#[derive(Debug, Clone, Default)]
pub struct Scanner {
    state: State,
    /// Chunk size being parsed, then data bytes remaining.
    size: u64,
    digits: u8,
    line_len: usize,
    trailer_len: usize,
    /// Inside a trailer line that is not forwarded (through its LF).
    omit: bool,
    /// Only chunk data is forwarded (framing and trailers are not).
    dechunk: bool,
    /// Once framing is broken nothing after it can be trusted: every later
    /// call returns the same error.
    failed: Option<ChunkError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// the body continues after the scanned bytes
    More,
    /// the body ended with the scanned bytes (what follows belongs to the next message)
    Done,
}

/// One run of a body: bytes at the start of the input that all go on to the next hop,
/// or all are left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// How many bytes the run has.
    pub len: usize,
    /// Whether they are forwarded: false for a trailer field that must not be
    /// ([`is_dropped_trailer`]) and, when de-chunking, for framing.
    pub forward: bool,
    pub progress: Progress,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    #[error("invalid chunk size")]
    InvalidSize,
    #[error("chunk size overflow")]
    SizeOverflow,
    #[error("chunk size too large")]
    SizeTooLarge,
    #[error("invalid chunk extension")]
    InvalidExtension,
    #[error("missing crlf after chunk data")]
    MissingDataCrlf,
    #[error("bare lf in chunked framing")]
    BareLf,
    #[error("bare cr in chunked framing")]
    BareCr,
    #[error("chunk size line too long")]
    LineTooLong,
    #[error("invalid trailer field")]
    InvalidTrailer,
    #[error("obsolete line folding in trailer")]
    TrailerObsFold,
    #[error("whitespace between trailer field name and colon")]
    TrailerWhitespaceBeforeColon,
    #[error("trailer section too large")]
    TrailersTooLarge,
}

impl Scanner {
    /// A scanner for a body forwarded chunked: everything but the trailer fields that
    /// must not be forwarded goes on.
    pub fn new() -> Self {
        Self::default()
    }

    /// A scanner for a body forwarded without its chunked framing (to a client that
    /// cannot read it): only chunk data goes on.
    pub fn dechunk() -> Self {
        Scanner { dechunk: true, ..Self::default() }
    }

    /// Scan the first run of `buf` (the bytes that follow those already scanned). A run
    /// ends where `buf` ends, where the body ends, or where forwarding starts or stops,
    /// so a caller calls again with the rest. It also ends, before `buf` does, at the
    /// start of a trailer field whose name is not whole yet: those bytes must be given
    /// again with the ones that follow (`len` 0 with `More` means: read more first).
    /// Never reads past the end of the body. Called again after Done it returns a run
    /// of 0 bytes, Done.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Scan, ChunkError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.scan_inner(buf);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn scan_inner(&mut self, buf: &[u8]) -> Result<Scan, ChunkError> {
        let mut i = 0;
        // The run's verdict, set by its first byte.
        let mut forward = None;
        while let Some(rest) = buf.get(i..).filter(|r| !r.is_empty()) {
            if self.state == State::Done {
                break;
            }
            let Some(goes_on) = self.forwards(rest) else { break };
            if *forward.get_or_insert(goes_on) != goes_on {
                break;
            }
            if self.state == State::Data {
                // Bulk path: data bytes are opaque, skip them at once.
                let take = usize::try_from(self.size).map_or(rest.len(), |s| s.min(rest.len()));
                i += take;
                self.skip_data(take as u64);
            } else {
                self.step(rest[0])?;
                i += 1;
            }
        }
        let progress = if self.state == State::Done { Progress::Done } else { Progress::More };
        Ok(Scan { len: i, forward: forward.unwrap_or(true), progress })
    }

    /// Whether the byte at the start of `rest` is forwarded; `None` when that depends
    /// on a trailer name not all in `rest` yet.
    fn forwards(&mut self, rest: &[u8]) -> Option<bool> {
        match self.state {
            State::Data => Some(true),
            _ if self.dechunk => Some(false),
            State::TrailerStart => {
                self.omit = dropped_line(rest)?;
                Some(!self.omit)
            }
            _ => Some(!self.omit),
        }
    }

    /// When inside chunk data, how many data bytes remain in the current
    /// chunk (so a caller can forward that many without scanning, e.g. with
    /// splice); 0 otherwise.
    pub fn data_remaining(&self) -> u64 {
        if self.state == State::Data {
            self.size
        } else {
            0
        }
    }

    /// Tell the scanner that `n` data bytes were forwarded without scan().
    /// `n` is clamped to `data_remaining()`; outside chunk data it is a no-op.
    pub fn skip_data(&mut self, n: u64) {
        if self.state == State::Data {
            self.size -= n.min(self.size);
            if self.size == 0 {
                self.state = State::ExpectDataCr;
            }
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Advance by one framing byte (never called in `Data` or `Done`).
    fn step(&mut self, b: u8) -> Result<(), ChunkError> {
        use State::*;
        let in_line = matches!(
            self.state,
            ExpectSize
                | InSize
                | SizeWs
                | ExtNameStart
                | ExtName
                | ExtNameWs
                | ExtValStart
                | ExtToken
                | ExtQuoted
                | ExtQuotedPair
                | ExtAfterQuoted
                | ExtValWs
        );
        if in_line && b != b'\r' {
            self.line_len += 1;
            if self.line_len > MAX_LINE {
                return Err(ChunkError::LineTooLong);
            }
        }
        if matches!(self.state, TrailerStart | TrailerName | TrailerValue | TrailerLf | FinalLf) {
            self.trailer_len += 1;
            if self.trailer_len > MAX_TRAILERS {
                return Err(ChunkError::TrailersTooLarge);
            }
        }
        let ws = b == b' ' || b == b'\t';
        self.state = match (self.state, b) {
            (ExpectSize | InSize, _) if b.is_ascii_hexdigit() => {
                self.push_digit(b)?;
                InSize
            }
            (ExpectSize, _) => return Err(ChunkError::InvalidSize),
            (InSize, b';') => ExtNameStart,
            (InSize, _) if ws => SizeWs,
            (InSize | ExtName | ExtToken | ExtAfterQuoted, b'\r') => ExpectLf,
            (InSize | SizeWs | ExtNameStart | ExtName | ExtNameWs, b'\n') => {
                return Err(ChunkError::BareLf)
            }
            (ExtValStart | ExtToken | ExtAfterQuoted | ExtValWs, b'\n') => {
                return Err(ChunkError::BareLf)
            }
            (InSize, _) => return Err(ChunkError::InvalidSize),
            (SizeWs | ExtNameWs | ExtValWs, b';') => ExtNameStart,
            (SizeWs | ExtNameStart | ExtNameWs | ExtValStart | ExtValWs, _) if ws => self.state,
            (ExtNameStart | ExtName, _) if is_tchar(b) => ExtName,
            (ExtName, b';') => ExtNameStart,
            (ExtName, b'=') | (ExtNameWs, b'=') => ExtValStart,
            (ExtName, _) if ws => ExtNameWs,
            (ExtValStart, b'"') => ExtQuoted,
            (ExtValStart | ExtToken, _) if is_tchar(b) => ExtToken,
            (ExtToken | ExtAfterQuoted, b';') => ExtNameStart,
            (ExtToken | ExtAfterQuoted, _) if ws => ExtValWs,
            (ExtQuoted, b'"') => ExtAfterQuoted,
            (ExtQuoted, b'\\') => ExtQuotedPair,
            (ExtQuoted, _) if is_qdtext(b) => ExtQuoted,
            // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
            (ExtQuotedPair, _) if ws || is_vchar_or_obs(b) => ExtQuoted,
            (
                SizeWs | ExtNameStart | ExtName | ExtNameWs | ExtValStart | ExtToken | ExtQuoted
                | ExtQuotedPair | ExtAfterQuoted | ExtValWs,
                _,
            ) => return Err(ChunkError::InvalidExtension),
            (ExpectLf, b'\n') if self.size == 0 => TrailerStart,
            (ExpectLf, b'\n') => Data,
            (TrailerLf, b'\n') => TrailerStart,
            (FinalLf, b'\n') => Done,
            (ExpectLf | TrailerLf | FinalLf, _) => return Err(ChunkError::BareCr),
            (ExpectDataCr, b'\r') => ExpectDataLf,
            (ExpectDataLf, b'\n') => {
                self.size = 0;
                self.digits = 0;
                self.line_len = 0;
                ExpectSize
            }
            (ExpectDataCr | ExpectDataLf, _) => return Err(ChunkError::MissingDataCrlf),
            (TrailerStart, b'\r') => FinalLf,
            (TrailerStart | TrailerName, _) if is_tchar(b) => TrailerName,
            (TrailerStart, _) if ws => return Err(ChunkError::TrailerObsFold),
            (TrailerName, b':') => TrailerValue,
            (TrailerName, _) if ws => return Err(ChunkError::TrailerWhitespaceBeforeColon),
            (TrailerStart | TrailerName | TrailerValue, b'\n') => return Err(ChunkError::BareLf),
            (TrailerStart | TrailerName, _) => return Err(ChunkError::InvalidTrailer),
            (TrailerValue, b'\r') => TrailerLf,
            (TrailerValue, _) if ws || is_vchar_or_obs(b) => TrailerValue,
            (TrailerValue, _) => return Err(ChunkError::InvalidTrailer),
            // scan_inner handles these two without calling step.
            (Data | Done, _) => self.state,
        };
        Ok(())
    }

    fn push_digit(&mut self, b: u8) -> Result<(), ChunkError> {
        self.digits += 1;
        if self.digits > MAX_SIZE_DIGITS {
            return Err(ChunkError::SizeOverflow);
        }
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(ChunkError::InvalidSize),
        };
        // 16 digits always fit; checked anyway so a logic slip cannot wrap.
        self.size = self
            .size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(d)))
            .ok_or(ChunkError::SizeOverflow)?;
        if self.size > MAX_LENGTH {
            return Err(ChunkError::SizeTooLarge);
        }
        Ok(())
    }
}

/// Whether the trailer line at the start of `rest` is left out; `None` when its name
/// has not arrived whole and could still be one of those. A line that is not a field
/// (the final CRLF, or malformed: the scanner's steps say so) is not left out.
fn dropped_line(rest: &[u8]) -> Option<bool> {
    for (k, &b) in rest.iter().enumerate().take(MAX_DROPPED_NAME + 1) {
        if b == b':' {
            return Some(is_dropped_trailer(&rest[..k]));
        }
        if !is_tchar(b) {
            return Some(false);
        }
    }
    // A name longer than any dropped one, or the rest still to come.
    (rest.len() > MAX_DROPPED_NAME).then_some(false)
}

/// qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text
fn is_qdtext(b: u8) -> bool {
    matches!(b, b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff)
}

fn is_vchar_or_obs(b: u8) -> bool {
    matches!(b, 0x21..=0x7e | 0x80..=0xff)
}
