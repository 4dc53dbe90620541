//! `Proxy-Authorization: Basic ...` (RFC 7617): the scheme, then base64 of `user:password`.

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

/// Longest credentials value looked at, in bytes: a user name of at most 64 bytes and any
/// sane password encode to far less, and the limit bounds the decoding work.
pub(crate) const MAX_BASIC_LEN: usize = 4096;

/// Standard base64; padding may be left out (some clients do), trailing bits must be zero.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a `Proxy-Authorization` value was not usable Basic credentials. Every one means the
/// same to the client (407); the variants are for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BasicError {
    #[error("credentials longer than {MAX_BASIC_LEN} bytes")]
    TooLong,
    #[error("not the Basic scheme")]
    NotBasic,
    #[error("no credentials after the Basic scheme")]
    Missing,
    #[error("credentials are not base64")]
    BadBase64,
    #[error("no ':' between user and password")]
    NoColon,
    #[error("empty user name")]
    EmptyUser,
    #[error("user name is not UTF-8")]
    UserNotUtf8,
    #[error("user name contains a control character")]
    UserControl,
}

/// Decodes a `Proxy-Authorization` value: the scheme `Basic` in any case, one or more
/// spaces, then base64 of `user:password`. The user ends at the first ':' (the password
/// may contain more), must not be empty, must be UTF-8 without control characters.
/// Whitespace around the whole value is ignored (it is not part of a field value).
///
/// The decoded bytes go into `scratch`, which the caller keeps and reuses: once it has
/// grown, no request allocates. It holds the password afterwards, so don't log it.
pub(crate) fn parse_basic<'a>(
    value: &[u8],
    scratch: &'a mut Vec<u8>,
) -> Result<(&'a str, &'a [u8]), BasicError> {
    if value.len() > MAX_BASIC_LEN {
        return Err(BasicError::TooLong);
    }
    let value = value.trim_ascii();
    let (scheme, token) = match value.iter().position(|&b| b == b' ') {
        Some(i) => (&value[..i], value[i..].trim_ascii_start()),
        None => (value, &[][..]),
    };
    if !scheme.eq_ignore_ascii_case(b"Basic") {
        return Err(BasicError::NotBasic);
    }
    if token.is_empty() {
        return Err(BasicError::Missing);
    }
    scratch.clear();
    BASE64.decode_vec(token, scratch).map_err(|_| BasicError::BadBase64)?;
    let decoded: &'a [u8] = scratch;
    let colon = decoded.iter().position(|&b| b == b':').ok_or(BasicError::NoColon)?;
    let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
    if user.is_empty() {
        return Err(BasicError::EmptyUser);
    }
    let user = std::str::from_utf8(user).map_err(|_| BasicError::UserNotUtf8)?;
    if user.chars().any(char::is_control) {
        return Err(BasicError::UserControl);
    }
    Ok((user, password))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Expected = Result<(&'static str, &'static [u8]), BasicError>;

    #[test]
    fn table() {
        let long = format!("Basic {}", "QUFB".repeat(1100));
        let just_long_enough = format!("Basic {}", "QUFB".repeat(1022));
        let cases: &[(&[u8], Expected)] = &[
            // alice:secret
            (b"Basic YWxpY2U6c2VjcmV0", Ok(("alice", b"secret"))),
            (b"basic YWxpY2U6c2VjcmV0", Ok(("alice", b"secret"))),
            (b"BASIC YWxpY2U6c2VjcmV0", Ok(("alice", b"secret"))),
            // Several spaces after the scheme (RFC 7235: 1*SP), whitespace around the value.
            (b"Basic    YWxpY2U6c2VjcmV0", Ok(("alice", b"secret"))),
            (b" \tBasic YWxpY2U6c2VjcmV0 \t", Ok(("alice", b"secret"))),
            // alice:pa:ss:word
            (b"Basic YWxpY2U6cGE6c3M6d29yZA==", Ok(("alice", b"pa:ss:word"))),
            // Padding left out: alice:pa:ss:word
            (b"Basic YWxpY2U6cGE6c3M6d29yZA", Ok(("alice", b"pa:ss:word"))),
            // alice: (empty password is the verifier's business)
            (b"Basic YWxpY2U6", Ok(("alice", b""))),
            // Non-UTF-8 password bytes are fine: alice:\xff\x00
            (b"Basic YWxpY2U6/wA=", Ok(("alice", b"\xff\x00"))),
            // jos\xc3\xa9:x (UTF-8 user)
            (b"Basic am9zw6k6eA==", Ok(("jos\u{e9}", b"x"))),
            (b"Basic YWxpY2U6c2VjcmV0!", Err(BasicError::BadBase64)),
            (b"Basic YWxp Y2U6c2VjcmV0", Err(BasicError::BadBase64)),
            (b"Basic YWxpY2U6c2VjcmV0\t", Ok(("alice", b"secret"))),
            // Tab instead of a space after the scheme.
            (b"Basic\tYWxpY2U6c2VjcmV0", Err(BasicError::NotBasic)),
            // alicesecret
            (b"Basic YWxpY2VzZWNyZXQ=", Err(BasicError::NoColon)),
            // :secret
            (b"Basic OnNlY3JldA==", Err(BasicError::EmptyUser)),
            // \xff:x
            (b"Basic /zp4", Err(BasicError::UserNotUtf8)),
            // a\nb:x
            (b"Basic YQpiOng=", Err(BasicError::UserControl)),
            (b"Bearer YWxpY2U6c2VjcmV0", Err(BasicError::NotBasic)),
            (b"Digest username=\"alice\"", Err(BasicError::NotBasic)),
            (b"BasicYWxpY2U6c2VjcmV0", Err(BasicError::NotBasic)),
            (b"Basic", Err(BasicError::Missing)),
            (b"Basic   ", Err(BasicError::Missing)),
            (b"", Err(BasicError::NotBasic)),
            (long.as_bytes(), Err(BasicError::TooLong)),
            // 4094 bytes of AAA...: no colon, but not too long.
            (just_long_enough.as_bytes(), Err(BasicError::NoColon)),
        ];
        let mut scratch = Vec::new();
        for (value, expected) in cases {
            let got = parse_basic(value, &mut scratch);
            assert_eq!(&got, expected, "{}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn scratch_is_reused() {
        let mut scratch = Vec::with_capacity(64);
        let before = scratch.as_ptr();
        for _ in 0..3 {
            let (user, password) = match parse_basic(b"Basic YWxpY2U6c2VjcmV0", &mut scratch) {
                Ok(ok) => ok,
                Err(e) => panic!("{e}"),
            };
            assert_eq!((user, password), ("alice", &b"secret"[..]));
        }
        assert_eq!(scratch.as_ptr(), before, "no reallocation");
    }
}
