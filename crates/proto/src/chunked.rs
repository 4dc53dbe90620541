//! Validating pass-through scanner for `Transfer-Encoding: chunked` bodies
//! (RFC 9112 7.1).
//!
//! The proxy forwards chunked bytes verbatim; this only finds where the body
//! ends and rejects malformed framing, so that the proxy and the next hop
//! can never disagree on where the message stops. It keeps a few integers of
//! state and accepts input split at any byte boundary.

#[cfg(test)]
mod tests;

// Extension and trailer names are tokens, same as header field names.
use crate::http::is_tchar;

/// Longest accepted chunk-size line (size + extensions, without CRLF).
const MAX_LINE: usize = 4096;
/// Largest accepted trailer section, including its final CRLF.
const MAX_TRAILERS: usize = 64 * 1024;
/// 16 hex digits fill a u64; more can only be overflow or padding abuse.
const MAX_SIZE_DIGITS: u8 = 16;

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
    /// Once framing is broken nothing after it can be trusted: every later
    /// call returns the same error.
    failed: Option<ChunkError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// all given bytes belong to the body and the body continues
    More,
    /// the body ended after `consumed` bytes (the rest of the buffer belongs to the next message)
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    #[error("invalid chunk size")]
    InvalidSize,
    #[error("chunk size overflow")]
    SizeOverflow,
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
    pub fn new() -> Self {
        Self::default()
    }

    /// Scan `buf` (bytes that follow those already scanned). Returns how many
    /// bytes of buf belong to the body and whether the body is finished.
    /// Never reads past the end of the body: on Done, consumed is the exact
    /// end (after the last-chunk, the trailer section and the final CRLF).
    /// Called again after Done it returns `(0, Done)`.
    pub fn scan(&mut self, buf: &[u8]) -> Result<(usize, Progress), ChunkError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.scan_inner(buf);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn scan_inner(&mut self, buf: &[u8]) -> Result<(usize, Progress), ChunkError> {
        let mut i = 0;
        while let Some(&b) = buf.get(i) {
            match self.state {
                State::Done => return Ok((i, Progress::Done)),
                State::Data => {
                    // Bulk path: data bytes are opaque, skip them at once.
                    let avail = buf.len() - i;
                    let take = usize::try_from(self.size).map_or(avail, |s| s.min(avail));
                    i += take;
                    self.skip_data(take as u64);
                }
                _ => {
                    self.step(b)?;
                    i += 1;
                }
            }
        }
        if self.state == State::Done {
            Ok((i, Progress::Done))
        } else {
            Ok((i, Progress::More))
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
        Ok(())
    }
}

/// qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text
fn is_qdtext(b: u8) -> bool {
    matches!(b, b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff)
}

fn is_vchar_or_obs(b: u8) -> bool {
    matches!(b, 0x21..=0x7e | 0x80..=0xff)
}
