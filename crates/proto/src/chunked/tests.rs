//! Chunked scanner tests: every split of a valid body gives the same bytes, a byte
//! table of malformed framing gives the same error however it arrives, and tables of
//! the trailer fields left out.
#![allow(clippy::unwrap_used)]

use super::*;

/// A body exercising extensions (token, quoted, quoted-pair, BWS),
/// uppercase and zero-padded sizes, an empty chunk line-up and trailers.
const BODY: &[u8] = b"4;a=b ; c = \"q\\\"x\" ;d\r\nWiki\r\n\
5\r\npedia\r\n\
00E; ext\r\n in\r\n\r\nchunks.\r\n\
A;n=\"\"\r\n0123456789\r\n\
0;last\r\nX-Trailer: v v\r\nEmpty:\r\n\r\n";

/// BODY's data, de-chunked.
const BODY_DATA: &[u8] = b"Wikipedia in\r\n\r\nchunks.0123456789";

/// A body whose trailer section mixes fields that go on with fields that must not.
const TRAILERED: &[u8] = b"5\r\nhello\r\n0\r\n\
X-Sum: 1\r\n\
Content-Length: 99\r\n\
host: evil.example\r\n\
X-A-Trailer-Name-Longer-Than-Any-Dropped: z\r\n\
PROXY-AUTHORIZATION: Basic eA==\r\n\
Transfer-Encoding: chunked\r\n\
Trailer: X-Sum\r\n\
X-End: 2\r\n\r\n";

/// TRAILERED as forwarded chunked.
const TRAILERED_OUT: &[u8] = b"5\r\nhello\r\n0\r\n\
X-Sum: 1\r\n\
X-A-Trailer-Name-Longer-Than-Any-Dropped: z\r\n\
X-End: 2\r\n\r\n";

const EXTRA: &[u8] = b"GET / HTTP/1.1\r\n";

fn with_extra(body: &[u8]) -> Vec<u8> {
    [body, EXTRA].concat()
}

/// What a caller of the scanner ends up with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// The bytes forwarded.
    out: Vec<u8>,
    /// The bytes of the input that belonged to the body.
    used: usize,
    done: bool,
    err: Option<ChunkError>,
}

/// Feeds `parts` in order as a proxy's read buffer would: bytes a run left unused stay
/// at its front and are scanned again with the next part.
fn drive(mut s: Scanner, parts: &[&[u8]]) -> Outcome {
    let mut pending = Vec::new();
    let mut o = Outcome { out: Vec::new(), used: 0, done: false, err: None };
    for part in parts {
        pending.extend_from_slice(part);
        loop {
            let r = match s.scan(&pending) {
                Ok(r) => r,
                Err(e) => {
                    o.err = Some(e);
                    return o;
                }
            };
            assert!(r.len <= pending.len());
            if r.forward {
                o.out.extend_from_slice(&pending[..r.len]);
            }
            pending.drain(..r.len);
            o.used += r.len;
            if r.progress == Progress::Done {
                o.done = true;
                return o;
            }
            if r.len == 0 {
                // Held back only for a trailer name, never more than it.
                assert!(pending.len() <= MAX_DROPPED_NAME, "held back {}", pending.len());
                break;
            }
        }
    }
    o
}

fn whole(s: Scanner, input: &[u8]) -> Outcome {
    drive(s, &[input])
}

/// A scanner mode's name and constructor.
type Mode = (&'static str, fn() -> Scanner);

fn modes() -> [Mode; 2] {
    [("chunked", Scanner::new), ("dechunk", Scanner::dechunk)]
}

#[test]
fn whole_bodies() {
    let rows: &[(&[u8], &[u8], &[u8])] =
        &[(BODY, BODY, BODY_DATA), (TRAILERED, TRAILERED_OUT, b"hello")];
    for (body, chunked, dechunked) in rows {
        let input = with_extra(body);
        for (mode, new, want) in [
            ("chunked", Scanner::new as fn() -> Scanner, chunked),
            ("dechunk", Scanner::dechunk, dechunked),
        ] {
            let o = whole(new(), &input);
            let ok = Outcome { out: want.to_vec(), used: body.len(), done: true, err: None };
            assert_eq!(o, ok, "{mode}: {:?}", String::from_utf8_lossy(&o.out));
        }
    }
    // Called again after Done: nothing more.
    let mut s = Scanner::new();
    drive_into(&mut s, TRAILERED).unwrap();
    assert!(s.is_done());
    let r = s.scan(EXTRA).unwrap();
    assert_eq!((r.len, r.progress), (0, Progress::Done));
}

/// The same verdict and the same bytes for every way the input can arrive (on an
/// error, only the error: how much went on before it depends on when it was seen).
fn same_however_split(input: &[u8], three_way: bool) {
    for (mode, new) in modes() {
        let want = whole(new(), input);
        let same = |o: Outcome, how: &str| {
            if want.err.is_some() {
                assert_eq!(o.err, want.err, "{mode}: {how}");
            } else {
                assert_eq!(o, want, "{mode}: {how}");
            }
        };
        let bytewise: Vec<&[u8]> = input.chunks(1).collect();
        same(drive(new(), &bytewise), "byte by byte");
        for k in 0..=input.len() {
            let (a, b) = input.split_at(k);
            same(drive(new(), &[a, b]), &format!("split at {k}"));
        }
        if !three_way {
            continue;
        }
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let parts = [&input[..i], &input[i..j], &input[j..]];
                same(drive(new(), &parts), &format!("split at {i},{j}"));
            }
        }
    }
}

#[test]
fn every_split_gives_the_same_bytes() {
    same_however_split(&with_extra(BODY), true);
    same_however_split(&with_extra(TRAILERED), true);
}

#[test]
fn every_split_gives_the_same_error() {
    for (what, body, want) in REJECT {
        let o = whole(Scanner::new(), body);
        assert_eq!(o.err.as_ref(), Some(want), "{what}");
        same_however_split(body, false);
    }
    // An error after a dropped trailer line, and inside one.
    for body in [&b"0\r\nHost: a\r\nX\x01: b\r\n\r\n"[..], b"0\r\nHost: a\x01\r\n\r\n"] {
        let o = whole(Scanner::new(), body);
        assert_eq!(o.err, Some(ChunkError::InvalidTrailer), "{body:?}");
        same_however_split(body, true);
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
    ];
    for body in rows {
        let r = Scanner::new().scan(body);
        let want = Scan { len: body.len(), forward: true, progress: Progress::Done };
        assert_eq!(r, Ok(want), "{:?}", String::from_utf8_lossy(body));
    }
}

/// Chunk sizes up to MAX_LENGTH are taken; one more is refused before any data.
#[test]
fn chunk_size_bound() {
    assert_eq!(MAX_LENGTH, 0x1f_ffff_ffff_ffff);
    let rows: &[(&[u8], Result<u64, ChunkError>)] = &[
        (b"1fffffffffffff\r\n", Ok(MAX_LENGTH)),
        (b"001FFFFFFFFFFFFF\r\n", Ok(MAX_LENGTH)),
        (b"1fffffffffffff;x=y\r\n", Ok(MAX_LENGTH)),
        (b"20000000000000\r\n", Err(ChunkError::SizeTooLarge)),
        (b"ffffffffffffffff\r\n", Err(ChunkError::SizeTooLarge)),
        (b"0000000000000000\r\n", Ok(0)),
        (b"00000000000000000\r\n", Err(ChunkError::SizeOverflow)),
        (b"10000000000000000\r\n", Err(ChunkError::SizeTooLarge)),
    ];
    for (line, want) in rows {
        let mut s = Scanner::new();
        let got = s.scan(line).map(|_| s.data_remaining());
        assert_eq!(got, *want, "{:?}", String::from_utf8_lossy(line));
    }
    // Refused as soon as the digits say so, before the line ends.
    assert_eq!(Scanner::new().scan(b"20000000000000"), Err(ChunkError::SizeTooLarge));
    assert!(!ChunkError::SizeTooLarge.to_string().is_empty());
}

#[test]
fn data_remaining_and_skip() {
    let mut s = Scanner::new();
    assert_eq!(s.data_remaining(), 0);
    assert_eq!(s.scan(b"a;x=1\r\n01").unwrap().len, 9);
    assert_eq!(s.data_remaining(), 8);
    s.skip_data(5);
    assert_eq!(s.data_remaining(), 3);
    // Skipping more than remains is clamped.
    s.skip_data(100);
    assert_eq!(s.data_remaining(), 0);
    let r = s.scan(b"\r\n0\r\n\r\nX").unwrap();
    assert_eq!((r.len, r.progress), (7, Progress::Done));
    // skip_data outside data is a no-op.
    s.skip_data(3);
    assert!(s.is_done());
}

/// In de-chunking mode, runs alternate between framing (left out) and data.
#[test]
fn dechunk_runs() {
    let mut s = Scanner::dechunk();
    let input = b"3\r\nabc\r\n2\r\nde\r\n0\r\nX: y\r\n\r\nNEXT";
    let mut runs = Vec::new();
    let mut rest = &input[..];
    loop {
        let r = s.scan(rest).unwrap();
        runs.push((String::from_utf8_lossy(&rest[..r.len]).into_owned(), r.forward));
        rest = &rest[r.len..];
        if r.progress == Progress::Done {
            break;
        }
    }
    let want: Vec<(String, bool)> = [
        ("3\r\n", false),
        ("abc", true),
        ("\r\n2\r\n", false),
        ("de", true),
        ("\r\n0\r\nX: y\r\n\r\n", false),
    ]
    .iter()
    .map(|(t, f)| (t.to_string(), *f))
    .collect();
    assert_eq!(runs, want);
    assert_eq!(rest, b"NEXT");
}

/// The fields RFC 9110 6.5.1 keeps out of trailers, in any case; others go on.
#[test]
fn dropped_trailer_names() {
    for name in [
        "Content-Length",
        "transfer-encoding",
        "TRAILER",
        "Host",
        "Cache-Control",
        "Expect",
        "Max-Forwards",
        "Pragma",
        "Range",
        "TE",
        "If-Match",
        "If-None-Match",
        "If-Modified-Since",
        "If-Unmodified-Since",
        "If-Range",
        "Authorization",
        "Proxy-Authorization",
        "WWW-Authenticate",
        "Proxy-Authenticate",
        "Cookie",
        "Set-Cookie",
        "Age",
        "Expires",
        "Date",
        "Location",
        "Retry-After",
        "Vary",
        "Warning",
        "Content-Encoding",
        "Content-Type",
        "Content-Range",
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "Upgrade",
    ] {
        assert!(is_dropped_trailer(name.as_bytes()), "{name}");
        assert!(name.len() <= MAX_DROPPED_NAME, "{name}");
    }
    for name in [
        "",
        "X-Checksum",
        "grpc-status",
        "grpc-message",
        "Server-Timing",
        "Digest",
        "Authentication-Info",
        "hosts",
        "x-host",
        "Content-Length-X",
        "Proxy-Authorization-Extra",
    ] {
        assert!(!is_dropped_trailer(name.as_bytes()), "{name}");
    }
}

/// (trailer section after `0\r\n`, what goes on when forwarding chunked).
const TRAILERS: &[(&[u8], &[u8])] = &[
    (b"\r\n", b"\r\n"),
    (b"X-Sum: 1\r\n\r\n", b"X-Sum: 1\r\n\r\n"),
    (b"Content-Length: 5\r\n\r\n", b"\r\n"),
    (b"content-length:5\r\nX: y\r\n\r\n", b"X: y\r\n\r\n"),
    (b"X: y\r\nHost: a\r\n\r\n", b"X: y\r\n\r\n"),
    (b"Host:\r\nHost: b\r\nHost:  c \r\n\r\n", b"\r\n"),
    (b"X-Host: a\r\nHostile: b\r\n\r\n", b"X-Host: a\r\nHostile: b\r\n\r\n"),
    (b"Proxy-Authorization: Basic eA==\r\n\r\n", b"\r\n"),
    (b"If-Unmodified-Since: x\r\nIf-Unmodified-Sinc: y\r\n\r\n", b"If-Unmodified-Sinc: y\r\n\r\n"),
    (b"If-Unmodified-Since2: y\r\n\r\n", b"If-Unmodified-Since2: y\r\n\r\n"),
    (b"TE: trailers\r\nTrailer: X\r\nTransfer-Encoding: chunked\r\n\r\n", b"\r\n"),
    (b"Empty:\r\nSet-Cookie: a=b\r\n\r\n", b"Empty:\r\n\r\n"),
];

#[test]
fn trailer_fields_left_out() {
    for (trailers, want) in TRAILERS {
        let body = [b"0\r\n", *trailers].concat();
        let o = whole(Scanner::new(), &with_extra(&body));
        let want_out = [b"0\r\n", *want].concat();
        assert_eq!(
            o,
            Outcome { out: want_out, used: body.len(), done: true, err: None },
            "{:?}",
            String::from_utf8_lossy(trailers)
        );
        same_however_split(&with_extra(&body), true);
        // De-chunked, no trailer goes on at all.
        assert_eq!(whole(Scanner::dechunk(), &body).out, b"");
    }
}

/// A trailer line is judged only once its name is in: the scanner holds back the
/// start of a line whose name could still be that of a dropped field.
#[test]
fn a_partial_trailer_name_is_held_back() {
    let mut s = Scanner::new();
    let r = s.scan(b"0\r\nConte").unwrap();
    assert_eq!(r, Scan { len: 3, forward: true, progress: Progress::More });
    assert_eq!(s.scan(b"Conte").unwrap().len, 0);
    let r = s.scan(b"Content-Length: 5\r\nX").unwrap();
    assert_eq!(r, Scan { len: 19, forward: false, progress: Progress::More });
    // `X` alone could still be `X-...` or anything: held back too, until its colon.
    assert_eq!(s.scan(b"X").unwrap().len, 0);
    let r = s.scan(b"X: 1\r\n\r\n").unwrap();
    assert_eq!(r, Scan { len: 8, forward: true, progress: Progress::Done });
    // A name longer than any dropped one is not waited for.
    let mut s = Scanner::new();
    let r = s.scan(b"0\r\nX-Twenty-One-Characters").unwrap();
    assert_eq!(r.len, 26);
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
    ("u64 overflow", b"10000000000000000\r\n", ChunkError::SizeTooLarge),
    ("u64 max", b"ffffffffffffffff\r\n", ChunkError::SizeTooLarge),
    ("2^53", b"20000000000000\r\n", ChunkError::SizeTooLarge),
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
    (
        "dropped name ws before colon",
        b"0\r\nHost : b\r\n\r\n",
        ChunkError::TrailerWhitespaceBeforeColon,
    ),
    ("dropped trailer obs-fold", b"0\r\nHost: b\r\n c\r\n\r\n", ChunkError::TrailerObsFold),
    ("trailer no colon", b"0\r\nAB\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer empty name", b"0\r\n: b\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer bad name", b"0\r\nA(: b\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer nul value", b"0\r\nA: \0\r\n\r\n", ChunkError::InvalidTrailer),
    ("trailer bare lf", b"0\r\nA: b\n\r\n", ChunkError::BareLf),
    ("dropped trailer bare lf", b"0\r\nHost: b\n\r\n", ChunkError::BareLf),
    ("trailer bare cr", b"0\r\nA: b\rc\r\n\r\n", ChunkError::BareCr),
    ("final bare lf", b"0\r\n\n", ChunkError::BareLf),
    ("final bare cr", b"0\r\n\rX", ChunkError::BareCr),
    ("last-chunk bare lf", b"0\n\r\n", ChunkError::BareLf),
];

#[test]
fn rejections() {
    for (what, body, want) in REJECT {
        for (mode, new) in modes() {
            let mut s = new();
            let o = drive(s.clone(), &[body]);
            assert_eq!(o.err.as_ref(), Some(want), "{what} {mode}");
            // Sticky: nothing after broken framing is trusted.
            let _ = drive_into(&mut s, body);
            assert_eq!(s.scan(b"0\r\n\r\n").err().as_ref(), Some(want), "{what} {mode}");
        }
        assert!(!want.to_string().is_empty());
    }
}

/// Scans all of `input` with `s` (runs in a row), up to the first error.
fn drive_into(s: &mut Scanner, mut input: &[u8]) -> Result<(), ChunkError> {
    loop {
        let r = s.scan(input)?;
        input = &input[r.len..];
        if r.len == 0 || r.progress == Progress::Done {
            return Ok(());
        }
    }
}

#[test]
fn line_too_long() {
    let mut line = b"1;a=".to_vec();
    line.resize(MAX_LINE, b'x');
    line.extend_from_slice(b"\r\nz\r\n0\r\n\r\n");
    let o = whole(Scanner::new(), &line);
    assert_eq!((o.used, o.done, o.err), (line.len(), true, None));
    let mut line = b"1;a=".to_vec();
    line.resize(MAX_LINE + 1, b'x');
    assert_eq!(Scanner::new().scan(&line), Err(ChunkError::LineTooLong));
}

#[test]
fn trailers_too_large() {
    let mut body = b"0\r\nX: ".to_vec();
    body.resize(MAX_TRAILERS + 10, b'a');
    assert_eq!(whole(Scanner::new(), &body).err, Some(ChunkError::TrailersTooLarge));
    // Many small fields count together, dropped ones too.
    for field in [&b"X: y\r\n"[..], b"Host: y\r\n"] {
        let mut body = b"0\r\n".to_vec();
        while body.len() < MAX_TRAILERS + 100 {
            body.extend_from_slice(field);
        }
        assert_eq!(whole(Scanner::new(), &body).err, Some(ChunkError::TrailersTooLarge));
    }
}

#[test]
fn empty_input_is_more() {
    let mut s = Scanner::new();
    assert_eq!(s.scan(b""), Ok(Scan { len: 0, forward: true, progress: Progress::More }));
    assert!(!s.is_done());
}

/// Arbitrary bytes never panic, in either mode, however split.
#[test]
fn mutations_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for base in [BODY, TRAILERED] {
        for _ in 0..10_000 {
            let mut m = base.to_vec();
            for _ in 0..3 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let i = (seed % m.len() as u64) as usize;
                m[i] = (seed >> 32) as u8;
            }
            let cut = (seed % m.len() as u64) as usize;
            for (_, new) in modes() {
                let o = drive(new(), &[&m[..cut], &m[cut..]]);
                assert!(o.used <= m.len() && o.out.len() <= o.used);
            }
        }
    }
}
