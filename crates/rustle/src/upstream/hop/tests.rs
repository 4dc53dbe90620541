//! The hop driver against scripted parents on `tokio::io::duplex`: each kind with and
//! without credentials, the tunnel's early bytes, every refusal and failure, replies
//! split byte by byte, and the mappings to a status and a SOCKS5 reply.
#![allow(clippy::unwrap_used, clippy::panic)]

use super::*;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{duplex, DuplexStream, ReadBuf};

const T: Duration = Duration::from_secs(5);

/// One step of a scripted parent.
enum Step {
    /// Read exactly these bytes (the test fails on anything else).
    Expect(&'static [u8]),
    /// Write these bytes in one write.
    Send(Vec<u8>),
    /// Keep the connection open without answering, until the client goes away.
    Hang,
}
use Step::*;

/// A parent that plays `steps`, then closes its end.
fn parent(steps: Vec<Step>) -> (DuplexStream, tokio::task::JoinHandle<()>) {
    let (client, mut server) = duplex(64 * 1024);
    let task = tokio::spawn(async move {
        for step in steps {
            match step {
                Expect(want) => {
                    let mut got = vec![0u8; want.len()];
                    server.read_exact(&mut got).await.unwrap();
                    assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&got));
                }
                Send(bytes) => server.write_all(&bytes).await.unwrap(),
                Hang => {
                    let mut sink = Vec::new();
                    let _ = server.read_to_end(&mut sink).await;
                }
            }
        }
    });
    (client, task)
}

/// A stream that hands its reader one byte per read: every reply arrives split at every
/// byte.
struct OneByte<S>(S);

impl<S: AsyncRead + Unpin> AsyncRead for OneByte<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut one = [0u8; 1];
        let mut small = ReadBuf::new(&mut one);
        match Pin::new(&mut self.0).poll_read(cx, &mut small) {
            Poll::Ready(Ok(())) => {
                buf.put_slice(small.filled());
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for OneByte<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

const ALICE: Option<Credentials<'static>> = Some(Credentials { user: "alice", password: "secret" });

async fn run(
    steps: Vec<Step>,
    kind: HopKind,
    creds: Option<Credentials<'_>>,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<u8>, HopError> {
    let (mut stream, task) = parent(steps);
    let got = tunnel(&mut stream, kind, creds, host, port, timeout).await;
    drop(stream);
    task.await.unwrap();
    got
}

const CONNECT_EXAMPLE: &[u8] = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n";
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

// ---------------------------------------------------------------- HTTP

#[tokio::test]
async fn http_connect_without_credentials() {
    let steps = vec![Expect(CONNECT_EXAMPLE), Send(ESTABLISHED.to_vec())];
    let early = run(steps, HopKind::Http, None, "example.com", 443, T).await.unwrap();
    assert!(early.is_empty());
}

#[tokio::test]
async fn http_connect_with_credentials() {
    let steps = vec![
        Expect(
            b"CONNECT 10.0.0.1:8443 HTTP/1.1\r\nHost: 10.0.0.1:8443\r\n\
Proxy-Authorization: Basic YWxpY2U6c2VjcmV0\r\n\r\n",
        ),
        Send(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n".to_vec()),
    ];
    let early = run(steps, HopKind::Http, ALICE, "10.0.0.1", 8443, T).await.unwrap();
    assert!(early.is_empty(), "a 2xx to CONNECT has no body: {early:?}");
}

#[tokio::test]
async fn http_connect_ipv6_in_brackets_either_way() {
    for host in ["2001:db8::1", "[2001:db8::1]"] {
        let steps = vec![
            Expect(b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n"),
            Send(ESTABLISHED.to_vec()),
        ];
        run(steps, HopKind::Http, None, host, 443, T).await.unwrap();
    }
}

#[tokio::test]
async fn http_connect_keeps_the_early_bytes() {
    let reply = [ESTABLISHED, b"\x16\x03\x01 server hello"].concat();
    let steps = vec![Expect(CONNECT_EXAMPLE), Send(reply)];
    let early = run(steps, HopKind::Http, None, "example.com", 443, T).await.unwrap();
    assert_eq!(early, b"\x16\x03\x01 server hello");
}

#[tokio::test]
async fn http_connect_skips_interim_responses() {
    let reply = [&b"HTTP/1.1 100 Continue\r\n\r\n"[..], ESTABLISHED, b"early"].concat();
    let steps = vec![Expect(CONNECT_EXAMPLE), Send(reply)];
    let early = run(steps, HopKind::Http, None, "example.com", 443, T).await.unwrap();
    assert_eq!(early, b"early");
}

#[tokio::test]
async fn http_refusals() {
    for status in [407u16, 403, 500, 502, 503, 504] {
        let reply = format!("HTTP/1.1 {status} No\r\nContent-Length: 2\r\n\r\nno");
        let steps = vec![Expect(CONNECT_EXAMPLE), Send(reply.into_bytes())];
        let e = run(steps, HopKind::Http, None, "example.com", 443, T).await.unwrap_err();
        assert!(matches!(e, HopError::Refused { status: s } if s == status), "{e:?}");
        assert_eq!(e.to_string(), format!("refused CONNECT: {status}"));
    }
}

#[tokio::test]
async fn http_malformed_replies() {
    let big = format!("HTTP/1.1 200 OK\r\nX-Pad: {}\r\n\r\n", "a".repeat(MAX_REPLY_HEAD));
    let rows: Vec<(Vec<u8>, &str)> = vec![
        (b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(), "sent a malformed reply: "),
        (b"\x05\x00".to_vec(), "sent a malformed reply: "),
        (b"HTTP/1.1 200 OK\nX: y\n\n".to_vec(), "sent a malformed reply: bare lf"),
        (big.into_bytes(), "sent a malformed reply: head too large"),
        (
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec(),
            "sent a malformed reply: 101 Switching Protocols in answer to CONNECT",
        ),
    ];
    for (reply, want) in rows {
        let steps = vec![Expect(CONNECT_EXAMPLE), Send(reply)];
        let e = run(steps, HopKind::Http, None, "example.com", 443, T).await.unwrap_err();
        assert!(matches!(e, HopError::Malformed(_)), "{e:?}");
        assert!(e.to_string().starts_with(want), "{e}");
        assert!(e.parent_failed());
    }
}

#[tokio::test]
async fn http_closed_and_truncated() {
    let steps = vec![Expect(CONNECT_EXAMPLE)];
    let e = run(steps, HopKind::Http, None, "example.com", 443, T).await.unwrap_err();
    assert!(matches!(e, HopError::Closed), "{e:?}");
    assert_eq!(e.to_string(), "closed the connection before its reply");

    let steps = vec![Expect(CONNECT_EXAMPLE), Send(b"HTTP/1.1 200 Connection est".to_vec())];
    let e = run(steps, HopKind::Http, None, "example.com", 443, T).await.unwrap_err();
    assert!(matches!(e, HopError::Truncated(27)), "{e:?}");
}

#[tokio::test]
async fn http_credentials_with_a_colon_are_refused_before_sending() {
    let creds = Some(Credentials { user: "a:b", password: "p" });
    let e = run(vec![], HopKind::Http, creds, "example.com", 443, T).await.unwrap_err();
    assert!(matches!(e, HopError::Credentials(_)), "{e:?}");
}

// ---------------------------------------------------------------- SOCKS5

const S5_CONNECT_EXAMPLE: &[u8] = b"\x05\x01\x00\x03\x0bexample.com\x01\xbb";
const S5_OK: &[u8] = b"\x05\x00\x00\x01\x0a\x00\x00\x01\x04\x38";

#[tokio::test]
async fn socks5_without_credentials() {
    let steps = vec![
        Expect(b"\x05\x01\x00"),
        Send(b"\x05\x00".to_vec()),
        Expect(S5_CONNECT_EXAMPLE),
        Send(S5_OK.to_vec()),
    ];
    let early = run(steps, HopKind::Socks5, None, "example.com", 443, T).await.unwrap();
    assert!(early.is_empty());
}

#[tokio::test]
async fn socks5_with_credentials() {
    let steps = vec![
        Expect(b"\x05\x02\x00\x02"),
        Send(b"\x05\x02".to_vec()),
        Expect(b"\x01\x05alice\x06secret"),
        Send(b"\x01\x00".to_vec()),
        Expect(b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50"),
        Send([S5_OK, b"early"].concat()),
    ];
    let early = run(steps, HopKind::Socks5, ALICE, "127.0.0.1", 80, T).await.unwrap();
    assert_eq!(early, b"early");
}

#[tokio::test]
async fn socks5_credentials_offered_but_not_wanted() {
    let steps = vec![
        Expect(b"\x05\x02\x00\x02"),
        Send(b"\x05\x00".to_vec()),
        Expect(b"\x05\x01\x00\x04\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x01\x01\xbb"),
        Send(S5_OK.to_vec()),
    ];
    run(steps, HopKind::Socks5, ALICE, "[2001:db8::1]", 443, T).await.unwrap();
}

#[tokio::test]
async fn socks5_no_acceptable_method() {
    let steps = vec![Expect(b"\x05\x01\x00"), Send(b"\x05\xff".to_vec())];
    let e = run(steps, HopKind::Socks5, None, "example.com", 443, T).await.unwrap_err();
    assert!(matches!(e, HopError::NoAcceptableMethod), "{e:?}");
    assert!(!e.parent_failed());
}

#[tokio::test]
async fn socks5_auth_failure() {
    for status in [1u8, 0xff] {
        let steps = vec![
            Expect(b"\x05\x02\x00\x02"),
            Send(b"\x05\x02".to_vec()),
            Expect(b"\x01\x05alice\x06secret"),
            Send(vec![1, status]),
        ];
        let e = run(steps, HopKind::Socks5, ALICE, "example.com", 443, T).await.unwrap_err();
        assert!(matches!(e, HopError::AuthFailed), "{e:?}");
        assert_eq!(e.to_string(), "rejected the username/password");
    }
}

#[tokio::test]
async fn socks5_refusal_codes() {
    for code in 1u8..=9 {
        let steps = vec![
            Expect(b"\x05\x01\x00"),
            Send(b"\x05\x00".to_vec()),
            Expect(S5_CONNECT_EXAMPLE),
            Send(vec![5, code, 0, 1, 0, 0, 0, 0, 0, 0]),
        ];
        let e = run(steps, HopKind::Socks5, None, "example.com", 443, T).await.unwrap_err();
        let HopError::SocksRefused { code: got, reason } = e else { panic!("{e:?}") };
        assert_eq!(got, code);
        let named = socks5::Reply::from_code(code);
        assert_eq!(reason, named.map_or("unassigned reply code", socks5::Reply::reason));
        assert_eq!(e.socks5_reply(), named.unwrap_or(socks5::Reply::GeneralFailure));
    }
}

#[tokio::test]
async fn socks5_malformed_replies() {
    let rows: &[(&[u8], &str)] = &[
        (b"\x04\x00", "unsupported socks version 4"),
        (b"\x05\x01", "server chose authentication method 0x01, which was not offered"),
        (b"\x05\x02", "server chose authentication method 0x02, which was not offered"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "unsupported socks version 72"),
    ];
    for (reply, want) in rows {
        let steps = vec![Expect(b"\x05\x01\x00"), Send(reply.to_vec())];
        let e = run(steps, HopKind::Socks5, None, "example.com", 443, T).await.unwrap_err();
        assert_eq!(e.to_string(), format!("sent a malformed reply: {want}"));
    }
    let rows: &[(&[u8], &str)] = &[
        (b"\x05\x00\x01\x01\0\0\0\0\0\0", "nonzero reserved field"),
        (b"\x05\x00\x00\x07\0\0\0\0\0\0", "unsupported address type 7"),
        (b"\x00\x5a\x00\x00\x00\x00\x00\x00", "unsupported socks version 0"),
    ];
    for (reply, want) in rows {
        let steps = vec![
            Expect(b"\x05\x01\x00"),
            Send(b"\x05\x00".to_vec()),
            Expect(S5_CONNECT_EXAMPLE),
            Send(reply.to_vec()),
        ];
        let e = run(steps, HopKind::Socks5, None, "example.com", 443, T).await.unwrap_err();
        assert_eq!(e.to_string(), format!("sent a malformed reply: {want}"));
    }
}

#[tokio::test]
async fn socks5_closed_and_truncated() {
    // Closed right after the greeting, and after the method choice.
    let e = run(vec![Expect(b"\x05\x01\x00")], HopKind::Socks5, None, "example.com", 443, T)
        .await
        .unwrap_err();
    assert!(matches!(e, HopError::Closed), "{e:?}");
    let steps =
        vec![Expect(b"\x05\x01\x00"), Send(b"\x05\x00".to_vec()), Expect(S5_CONNECT_EXAMPLE)];
    let e = run(steps, HopKind::Socks5, None, "example.com", 443, T).await.unwrap_err();
    assert!(matches!(e, HopError::Closed), "{e:?}");

    let steps = vec![
        Expect(b"\x05\x01\x00"),
        Send(b"\x05\x00".to_vec()),
        Expect(S5_CONNECT_EXAMPLE),
        Send(S5_OK[..5].to_vec()),
    ];
    let e = run(steps, HopKind::Socks5, None, "example.com", 443, T).await.unwrap_err();
    assert!(matches!(e, HopError::Truncated(5)), "{e:?}");
    assert_eq!(e.to_string(), "closed the connection in the middle of its reply (after 5 bytes)");
}

#[tokio::test]
async fn socks5_unsendable_credentials_send_nothing() {
    let long = "x".repeat(256);
    for (user, password) in [("", "p"), ("u", ""), (long.as_str(), "p"), ("u", long.as_str())] {
        let creds = Some(Credentials { user, password });
        let e = run(vec![], HopKind::Socks5, creds, "example.com", 443, T).await.unwrap_err();
        assert!(matches!(e, HopError::Credentials(_)), "{e:?}");
    }
}

#[tokio::test]
async fn udp_associate_returns_the_relay() {
    let (mut stream, task) = parent(vec![
        Expect(b"\x05\x02\x00\x02"),
        Send(b"\x05\x02".to_vec()),
        Expect(b"\x01\x05alice\x06secret"),
        Send(b"\x01\x00".to_vec()),
        Expect(b"\x05\x03\x00\x01\x7f\x00\x00\x01\x30\x39"),
        Send(b"\x05\x00\x00\x01\x7f\x00\x00\x02\x13\x88".to_vec()),
    ]);
    let hint: SocketAddr = "127.0.0.1:12345".parse().unwrap();
    let relay = udp_associate(&mut stream, ALICE, hint, T).await.unwrap();
    assert_eq!(relay, "127.0.0.2:5000".parse::<SocketAddr>().unwrap());
    drop(stream);
    task.await.unwrap();
}

#[tokio::test]
async fn udp_associate_failures() {
    let rows: &[(&[u8], &str)] = &[
        (
            b"\x05\x07\x00\x01\0\0\0\0\0\0",
            "refused the SOCKS5 request: command not supported (reply 7)",
        ),
        (
            b"\x05\x00\x00\x03\x05relay\x13\x88",
            "sent a malformed reply: UDP relay named relay:5000, not an address",
        ),
        (b"\x05\x00\x00\x01\x7f\0\0\x01\0\0", "sent a malformed reply: UDP relay on port 0"),
    ];
    for (reply, want) in rows {
        let (mut stream, task) = parent(vec![
            Expect(b"\x05\x01\x00"),
            Send(b"\x05\x00".to_vec()),
            Expect(b"\x05\x03\x00\x01\0\0\0\0\0\0"),
            Send(reply.to_vec()),
        ]);
        let hint: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let e = udp_associate(&mut stream, None, hint, T).await.unwrap_err();
        assert_eq!(e.to_string(), *want);
        drop(stream);
        task.await.unwrap();
    }
}

// ---------------------------------------------------------------- SOCKS4a

#[tokio::test]
async fn socks4a_name_without_and_with_a_user() {
    for (creds, request) in [
        (None, &b"\x04\x01\x01\xbb\x00\x00\x00\x01\x00example.com\x00"[..]),
        (ALICE, b"\x04\x01\x01\xbb\x00\x00\x00\x01alice\x00example.com\x00"),
    ] {
        let steps = vec![Expect(request), Send(b"\x00\x5a\x00\x00\x00\x00\x00\x00early".to_vec())];
        let early = run(steps, HopKind::Socks4a, creds, "example.com", 443, T).await.unwrap();
        assert_eq!(early, b"early");
    }
}

#[tokio::test]
async fn socks4a_ipv4_literal_is_plain_socks4() {
    let steps = vec![
        Expect(b"\x04\x01\x00\x50\x0a\x01\x02\x03alice\x00"),
        Send(b"\x00\x5a\x00\x00\x00\x00\x00\x00".to_vec()),
    ];
    let early = run(steps, HopKind::Socks4a, ALICE, "10.1.2.3", 80, T).await.unwrap();
    assert!(early.is_empty());
}

#[tokio::test]
async fn socks4a_refusals() {
    for code in [0x5bu8, 0x5c, 0x5d, 0x00] {
        let steps = vec![
            Expect(b"\x04\x01\x00\x50\x0a\x01\x02\x03\x00"),
            Send(vec![0, code, 0, 0, 0, 0, 0, 0]),
        ];
        let e = run(steps, HopKind::Socks4a, None, "10.1.2.3", 80, T).await.unwrap_err();
        assert!(matches!(e, HopError::Socks4Refused { code: c, .. } if c == code), "{e:?}");
        let want = if code == 0x5b {
            socks5::Reply::ConnectionRefused
        } else {
            socks5::Reply::GeneralFailure
        };
        assert_eq!(e.socks5_reply(), want);
    }
    let steps = vec![
        Expect(b"\x04\x01\x00\x50\x0a\x01\x02\x03\x00"),
        Send(b"\x00\x5b\x00\x00\x00\x00\x00\x00".to_vec()),
    ];
    let e = run(steps, HopKind::Socks4a, None, "10.1.2.3", 80, T).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "refused the SOCKS4a request: request rejected or failed (reply 0x5b)"
    );
}

#[tokio::test]
async fn socks4a_malformed_closed_truncated() {
    let request: &'static [u8] = b"\x04\x01\x00\x50\x0a\x01\x02\x03\x00";
    let steps = vec![Expect(request), Send(b"\x04\x5a\x00\x00\x00\x00\x00\x00".to_vec())];
    let e = run(steps, HopKind::Socks4a, None, "10.1.2.3", 80, T).await.unwrap_err();
    assert_eq!(e.to_string(), "sent a malformed reply: unsupported socks4 reply version 4");

    let e =
        run(vec![Expect(request)], HopKind::Socks4a, None, "10.1.2.3", 80, T).await.unwrap_err();
    assert!(matches!(e, HopError::Closed), "{e:?}");

    let steps = vec![Expect(request), Send(b"\x00\x5a\x00".to_vec())];
    let e = run(steps, HopKind::Socks4a, None, "10.1.2.3", 80, T).await.unwrap_err();
    assert!(matches!(e, HopError::Truncated(3)), "{e:?}");
}

#[tokio::test]
async fn socks4a_cannot_carry_ipv6_and_sends_nothing() {
    let e = run(vec![], HopKind::Socks4a, None, "2001:db8::1", 443, T).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot be asked for [2001:db8::1]:443: SOCKS4a carries no IPv6 address"
    );
    assert_eq!(e.socks5_reply(), socks5::Reply::AddressTypeNotSupported);
    assert_eq!(e.status(), 502);
}

// ---------------------------------------------------------------- every kind

#[tokio::test]
async fn bad_destinations_send_nothing() {
    let long = "a".repeat(256);
    for kind in [HopKind::Http, HopKind::Socks5, HopKind::Socks4a] {
        for (host, port) in [("example.com", 0), ("", 80), (long.as_str(), 80), ("a b", 80)] {
            let e = run(vec![], kind, None, host, port, T).await.unwrap_err();
            assert!(matches!(e, HopError::Target { .. }), "{kind:?} {host:?}: {e:?}");
        }
    }
    // Printable, so SOCKS carries it, but not a host name an HTTP proxy takes.
    let e = run(vec![], HopKind::Http, None, "a@b", 80, T).await.unwrap_err();
    assert!(matches!(e, HopError::Target { .. }), "{e:?}");
}

#[tokio::test]
async fn replies_split_byte_by_byte() {
    let cases: Vec<(HopKind, Option<Credentials<'static>>, Vec<Step>)> = vec![
        (HopKind::Http, None, vec![Expect(CONNECT_EXAMPLE), Send([ESTABLISHED, b"xy"].concat())]),
        (
            HopKind::Socks5,
            ALICE,
            vec![
                Expect(b"\x05\x02\x00\x02"),
                Send(b"\x05\x02".to_vec()),
                Expect(b"\x01\x05alice\x06secret"),
                Send(b"\x01\x00".to_vec()),
                Expect(S5_CONNECT_EXAMPLE),
                Send([&b"\x05\x00\x00\x03\x05relay\x13\x88"[..], b"xy"].concat()),
            ],
        ),
        (
            HopKind::Socks4a,
            None,
            vec![
                Expect(b"\x04\x01\x01\xbb\x00\x00\x00\x01\x00example.com\x00"),
                Send(b"\x00\x5a\x00\x00\x00\x00\x00\x00xy".to_vec()),
            ],
        ),
    ];
    for (kind, creds, steps) in cases {
        let (stream, task) = parent(steps);
        let mut stream = OneByte(stream);
        let early = tunnel(&mut stream, kind, creds, "example.com", 443, T).await.unwrap();
        // One byte per read: the reply's last byte came alone, the tunnel's stay unread.
        assert!(early.is_empty(), "{kind:?}: {early:?}");
        let mut rest = [0u8; 2];
        stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"xy", "{kind:?}");
        drop(stream);
        task.await.unwrap();
    }
}

#[tokio::test]
async fn a_silent_parent_times_out() {
    let short = Duration::from_millis(100);
    let cases: Vec<(HopKind, Vec<Step>)> = vec![
        (HopKind::Http, vec![Expect(CONNECT_EXAMPLE), Send(b"HTTP/1.1 200".to_vec()), Hang]),
        (HopKind::Socks5, vec![Expect(b"\x05\x01\x00"), Hang]),
        (HopKind::Socks4a, vec![Hang]),
    ];
    for (kind, steps) in cases {
        let (mut stream, task) = parent(steps);
        let started = std::time::Instant::now();
        let e = tunnel(&mut stream, kind, None, "example.com", 443, short).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "{kind:?}");
        assert!(matches!(e, HopError::Timeout(d) if d == short), "{kind:?}: {e:?}");
        assert_eq!(e.to_string(), "did not answer in 100ms");
        assert_eq!(e.status(), 504);
        assert_eq!(e.socks5_reply(), socks5::Reply::TtlExpired);
        assert!(e.parent_failed());
        drop(stream);
        task.await.unwrap();
    }
    assert_eq!(HopError::Timeout(Duration::from_secs(10)).to_string(), "did not answer in 10s");
}

#[test]
fn mappings() {
    use socks5::Reply as R;
    let rows: Vec<(HopError, u16, R, bool)> = vec![
        (HopError::Refused { status: 407 }, 502, R::GeneralFailure, false),
        (HopError::Refused { status: 403 }, 502, R::NotAllowed, false),
        (HopError::Refused { status: 502 }, 502, R::ConnectionRefused, false),
        (HopError::Refused { status: 503 }, 502, R::ConnectionRefused, false),
        (HopError::Refused { status: 504 }, 504, R::TtlExpired, false),
        (HopError::SocksRefused { code: 5, reason: "" }, 502, R::ConnectionRefused, false),
        (HopError::SocksRefused { code: 4, reason: "" }, 502, R::HostUnreachable, false),
        (HopError::SocksRefused { code: 6, reason: "" }, 504, R::TtlExpired, false),
        (HopError::SocksRefused { code: 0x42, reason: "" }, 502, R::GeneralFailure, false),
        (HopError::Socks4Refused { code: 0x5b, reason: "" }, 502, R::ConnectionRefused, false),
        (HopError::AuthFailed, 502, R::GeneralFailure, false),
        (HopError::NoAcceptableMethod, 502, R::GeneralFailure, false),
        (HopError::Credentials("x"), 502, R::GeneralFailure, false),
        (HopError::Malformed("x".into()), 502, R::GeneralFailure, true),
        (HopError::Closed, 502, R::GeneralFailure, true),
        (HopError::Truncated(3), 502, R::GeneralFailure, true),
        (HopError::Timeout(T), 504, R::TtlExpired, true),
        (HopError::Io(std::io::ErrorKind::ConnectionReset.into()), 502, R::GeneralFailure, true),
    ];
    for (e, status, reply, failed) in rows {
        assert_eq!(
            (e.status(), e.socks5_reply(), e.parent_failed()),
            (status, reply, failed),
            "{e:?}"
        );
        let line = format!("parent \"corp\" (127.0.0.1:3128) {e}");
        assert!(!line.contains('\n'), "{line}");
    }
    let e = HopError::Refused { status: 407 };
    assert_eq!(
        format!("parent \"corp\" (127.0.0.1:3128) {e}"),
        "parent \"corp\" (127.0.0.1:3128) refused CONNECT: 407"
    );
}

#[test]
fn credentials_debug_hides_the_password() {
    let shown = format!("{:?}", Credentials { user: "alice", password: "hunter2" });
    assert!(shown.contains("alice") && !shown.contains("hunter2"), "{shown}");
}
