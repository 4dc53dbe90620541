//! Chunked scanner tests: every split of a valid body, and a byte table of
//! malformed framing.
#![allow(clippy::unwrap_used)]

use super::*;

/// A body exercising extensions (token, quoted, quoted-pair, BWS),
/// uppercase and zero-padded sizes, an empty chunk line-up and trailers.
const BODY: &[u8] = b"4;a=b ; c = \"q\\\"x\" ;d\r\nWiki\r\n\
5\r\npedia\r\n\
00E; ext\r\n in\r\n\r\nchunks.\r\n\
A;n=\"\"\r\n0123456789\r\n\
0;last\r\nX-Trailer: v v\r\nEmpty:\r\n\r\n";

const EXTRA: &[u8] = b"GET / HTTP/1.1\r\n";

fn full() -> Vec<u8> {
    let mut v = BODY.to_vec();
    v.extend_from_slice(EXTRA);
    v
}

#[test]
fn whole_body_at_once() {
    let mut s = Scanner::new();
    assert_eq!(s.scan(&full()), Ok((BODY.len(), Progress::Done)));
    assert!(s.is_done());
    assert_eq!(s.scan(EXTRA), Ok((0, Progress::Done)));
}

#[test]
fn one_byte_at_a_time() {
    let input = full();
    let mut s = Scanner::new();
    let mut total = 0;
    for (i, b) in input.iter().enumerate() {
        let (n, p) = s.scan(std::slice::from_ref(b)).unwrap();
        total += n;
        if i + 1 < BODY.len() {
            assert_eq!((n, p), (1, Progress::More), "byte {i}");
        } else if i + 1 == BODY.len() {
            assert_eq!((n, p), (1, Progress::Done), "byte {i}");
        } else {
            assert_eq!((n, p), (0, Progress::Done), "byte {i}");
        }
    }
    assert_eq!(total, BODY.len());
}

/// Feed `parts` in order; returns the total consumed and whether Done was
/// reported exactly once the body ended.
fn feed(parts: &[&[u8]]) -> usize {
    let mut s = Scanner::new();
    let mut total = 0;
    for part in parts {
        let (n, p) = s.scan(part).unwrap();
        total += n;
        if total < BODY.len() {
            assert_eq!((n, p), (part.len(), Progress::More));
        } else {
            assert_eq!(p, Progress::Done);
            assert!(n <= part.len());
        }
    }
    total
}

#[test]
fn all_two_way_splits() {
    let input = full();
    for k in 0..=input.len() {
        let (a, b) = input.split_at(k);
        assert_eq!(feed(&[a, b]), BODY.len(), "split at {k}");
    }
}

#[test]
fn all_three_way_splits() {
    let input = full();
    for i in 0..=input.len() {
        for j in i..=input.len() {
            let parts = [&input[..i], &input[i..j], &input[j..]];
            assert_eq!(feed(&parts), BODY.len(), "split at {i},{j}");
        }
    }
}

#[test]
fn minimal_and_variants() {
    let rows: &[&[u8]] = &[
        b"0\r\n\r\n",
        b"000\r\n\r\n",
        b"1\r\na\r\n0\r\n\r\n",
        b"a\r\n0123456789\r\n0\r\n\r\n",
        b"A\r\n0123456789\r\n0\r\n\r\n",
        b"1;x\r\na\r\n0\r\n\r\n",
        b"1 ;x\r\na\r\n0\r\n\r\n",
        b"1\t;\tx\t=\ty\r\na\r\n0\r\n\r\n",
        b"1;x=\"a\\\tb \\\xff\"\r\na\r\n0\r\n\r\n",
        b"1;x=\"\xff\"\r\na\r\n0\r\n\r\n",
        b"1;a;b=c;d=\"e\"\r\na\r\n0\r\n\r\n",
        b"0\r\nA: \xff\tb\r\n\r\n",
        b"ffffffffffffffff\r\n",
    ];
    for body in rows {
        let mut s = Scanner::new();
        let r = s.scan(body);
        let want = if body.starts_with(b"ffff") { Progress::More } else { Progress::Done };
        assert_eq!(r, Ok((body.len(), want)), "{:?}", String::from_utf8_lossy(body));
    }
}

#[test]
fn data_remaining_and_skip() {
    let mut s = Scanner::new();
    assert_eq!(s.data_remaining(), 0);
    assert_eq!(s.scan(b"a;x=1\r\n01"), Ok((9, Progress::More)));
    assert_eq!(s.data_remaining(), 8);
    s.skip_data(5);
    assert_eq!(s.data_remaining(), 3);
    // Skipping more than remains is clamped.
    s.skip_data(100);
    assert_eq!(s.data_remaining(), 0);
    assert_eq!(s.scan(b"\r\n0\r\n\r\nX"), Ok((7, Progress::Done)));
    // skip_data outside data is a no-op.
    s.skip_data(3);
    assert!(s.is_done());

    let mut s = Scanner::new();
    assert_eq!(s.scan(b"ffffffffffffffff\r\n"), Ok((18, Progress::More)));
    assert_eq!(s.data_remaining(), u64::MAX);
}

const REJECT: &[(&str, &[u8], ChunkError)] = &[
    ("empty size", b"\r\n", ChunkError::InvalidSize),
    ("non-hex size", b"g\r\n", ChunkError::InvalidSize),
    ("size suffix", b"4x\r\nWiki", ChunkError::InvalidSize),
    ("negative size", b"-1\r\n", ChunkError::InvalidSize),
    ("0x prefix", b"0x4\r\n", ChunkError::InvalidSize),
    ("leading space", b" 4\r\n", ChunkError::InvalidSize),
    ("plus sign", b"+4\r\n", ChunkError::InvalidSize),
    ("17 digits", b"00000000000000001\r\n", ChunkError::SizeOverflow),
    ("overflow", b"10000000000000000\r\n", ChunkError::SizeOverflow),
    ("ws then crlf", b"4 \r\nWiki", ChunkError::InvalidExtension),
    ("ws then data", b"4 x\r\n", ChunkError::InvalidExtension),
    ("empty ext name", b"4;\r\n", ChunkError::InvalidExtension),
    ("empty ext name before ;", b"4;;a\r\n", ChunkError::InvalidExtension),
    ("ext name ws crlf", b"4;a \r\n", ChunkError::InvalidExtension),
    ("ext two names", b"4;a b\r\n", ChunkError::InvalidExtension),
    ("ext empty value", b"4;a=\r\n", ChunkError::InvalidExtension),
    ("ext value ws crlf", b"4;a=b \r\n", ChunkError::InvalidExtension),
    ("ext two values", b"4;a=b c\r\n", ChunkError::InvalidExtension),
    ("ext bad name char", b"4;a@b\r\n", ChunkError::InvalidExtension),
    ("ext bad value char", b"4;a=b/c\r\n", ChunkError::InvalidExtension),
    ("ext unterminated quote", b"4;a=\"x\r\n", ChunkError::InvalidExtension),
    ("ext ctl in quote", b"4;a=\"\x01\"\r\n", ChunkError::InvalidExtension),
    ("ext junk after quote", b"4;a=\"x\"y\r\n", ChunkError::InvalidExtension),
    ("ext bad quoted-pair", b"4;a=\"\\\x01\"\r\n", ChunkError::InvalidExtension),
    ("ext double equals", b"4;a==b\r\n", ChunkError::InvalidExtension),
    ("bare lf after size", b"4\nWiki", ChunkError::BareLf),
    ("bare lf after ext", b"4;a=b\nWiki", ChunkError::BareLf),
    ("bare cr after size", b"4\rWiki", ChunkError::BareCr),
    ("data too long", b"4\r\nWikiX\r\n", ChunkError::MissingDataCrlf),
    ("data lf only", b"4\r\nWiki\n0\r\n\r\n", ChunkError::MissingDataCrlf),
    ("data cr only", b"4\r\nWiki\rX", ChunkError::MissingDataCrlf),
    ("trailer obs-fold", b"0\r\nA: b\r\n c\r\n\r\n", ChunkError::TrailerObsFold),
    ("trailer leading ws", b"0\r\n\tA: b\r\n\r\n", ChunkError::TrailerObsFold),
    ("trailer ws before colon", b"0\r\nA : b\r\n\r\n", ChunkError::TrailerWhitespaceBeforeColon),
    ("trailer no colon", b"0\r\nAB\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer empty name", b"0\r\n: b\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer bad name", b"0\r\nA(: b\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer nul value", b"0\r\nA: \0\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer bare lf", b"0\r\nA: b\n\r\n", ChunkError::BareLf),
    ("trailer bare cr", b"0\r\nA: b\rc\r\n\r\n", ChunkError::BareCr),
    ("final bare lf", b"0\r\n\n", ChunkError::BareLf),
    ("final bare cr", b"0\r\n\rX", ChunkError::BareCr),
    ("last-chunk bare lf", b"0\n\r\n", ChunkError::BareLf),
];

#[test]
fn rejections() {
    for (what, body, want) in REJECT {
        let mut s = Scanner::new();
        assert_eq!(s.scan(body).err().as_ref(), Some(want), "{what}");
        // Sticky: nothing after broken framing is trusted.
        assert_eq!(s.scan(b"0\r\n\r\n").err().as_ref(), Some(want), "{what}");
        // Same result byte by byte.
        let mut s = Scanner::new();
        let got = body.iter().find_map(|b| s.scan(std::slice::from_ref(b)).err());
        assert_eq!(got.as_ref(), Some(want), "{what} bytewise");
        assert!(!want.to_string().is_empty());
    }
}

#[test]
fn line_too_long() {
    let mut line = b"1;a=".to_vec();
    line.resize(MAX_LINE, b'x');
    line.extend_from_slice(b"\r\nz\r\n0\r\n\r\n");
    assert_eq!(Scanner::new().scan(&line), Ok((line.len(), Progress::Done)));
    let mut line = b"1;a=".to_vec();
    line.resize(MAX_LINE + 1, b'x');
    assert_eq!(Scanner::new().scan(&line), Err(ChunkError::LineTooLong));
}

#[test]
fn trailers_too_large() {
    let mut body = b"0\r\nX: ".to_vec();
    body.resize(MAX_TRAILERS + 10, b'a');
    assert_eq!(Scanner::new().scan(&body), Err(ChunkError::TrailersTooLarge));
    // Many small fields count together.
    let mut body = b"0\r\n".to_vec();
    while body.len() < MAX_TRAILERS + 100 {
        body.extend_from_slice(b"X: y\r\n");
    }
    assert_eq!(Scanner::new().scan(&body), Err(ChunkError::TrailersTooLarge));
}

#[test]
fn empty_input_is_more() {
    let mut s = Scanner::new();
    assert_eq!(s.scan(b""), Ok((0, Progress::More)));
    assert!(!s.is_done());
}

/// Arbitrary bytes never panic.
#[test]
fn mutations_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        let mut m = BODY.to_vec();
        for _ in 0..3 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed % m.len() as u64) as usize;
            m[i] = (seed >> 32) as u8;
        }
        let mut s = Scanner::new();
        let cut = (seed % m.len() as u64) as usize;
        if let Ok((n, _)) = s.scan(&m[..cut]) {
            assert!(n <= cut);
            let _ = s.scan(&m[cut..]);
        }
    }
}
