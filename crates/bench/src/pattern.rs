//! The deterministic body pattern served by `/bytes/N`, `/chunked/N` and
//! `/close/N`, plus helpers to check it on the client side.
//!
//! The pattern repeats every 251 bytes (a prime, so it does not line up with
//! power-of-two buffer sizes and a shifted or duplicated block changes the
//! hash) and covers byte values 0..=250, including CR, LF and NUL, so any
//! text-mode mangling shows up.

use sha2::{Digest, Sha256};

/// Period of the pattern.
pub const PERIOD: usize = 251;

/// Byte `i` of the pattern.
#[inline]
pub fn pattern_byte(i: u64) -> u8 {
    // The remainder is < 251, so the cast cannot truncate.
    (i % PERIOD as u64) as u8
}

/// The first `n` bytes of the pattern (allocates `n`; for tests).
pub fn pattern(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    let mut left = n;
    while left > 0 {
        let take = left.min(BLOCK_LEN);
        v.extend_from_slice(&BLOCK[..take]);
        left -= take;
    }
    v
}

/// Hex SHA-256 of the first `n` bytes of the pattern, computed in constant
/// memory so it works for multi-GB sizes.
pub fn pattern_sha256_hex(n: u64) -> String {
    let mut h = Sha256::new();
    let mut left = n;
    while left > 0 {
        let take = left.min(BLOCK_LEN as u64) as usize;
        h.update(&BLOCK[..take]);
        left -= take as u64;
    }
    hex(&h.finalize())
}

/// Lower-case hex encoding.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Largest slice the server hands to one write: a whole number of periods, so
/// consecutive blocks continue the pattern seamlessly.
pub(crate) const BLOCK_LEN: usize = PERIOD * 256;

/// `BLOCK_LEN + PERIOD` pattern bytes, built at compile time: a slice of
/// length up to `BLOCK_LEN` starting at any phase `off < PERIOD` is
/// `BLOCK[off..off + len]`, so streaming never computes pattern bytes.
static BLOCK: [u8; BLOCK_LEN + PERIOD] = build_block();

const fn build_block() -> [u8; BLOCK_LEN + PERIOD] {
    let mut b = [0u8; BLOCK_LEN + PERIOD];
    let mut i = 0;
    while i < b.len() {
        b[i] = (i % PERIOD) as u8;
        i += 1;
    }
    b
}

/// Pattern bytes `offset .. offset + len` where `len <= BLOCK_LEN`.
#[inline]
pub(crate) fn slice_at(offset: u64, len: usize) -> &'static [u8] {
    debug_assert!(len <= BLOCK_LEN);
    let phase = (offset % PERIOD as u64) as usize;
    &BLOCK[phase..phase + len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_continue_the_pattern() {
        let p = pattern(3 * BLOCK_LEN + 17);
        for (i, b) in p.iter().enumerate() {
            assert_eq!(*b, pattern_byte(i as u64));
        }
        assert_eq!(slice_at(1000, 50), &p[1000..1050]);
        let mut h = Sha256::new();
        h.update(&p);
        assert_eq!(hex(&h.finalize()), pattern_sha256_hex(p.len() as u64));
    }
}
