//! HTTP/2 from clients, over h2c with prior knowledge: the `h2` crate as the client for
//! requests, CONNECT and WebSocket streams, and hand-written frames for what a
//! well-behaved client library refuses to send (floods, forbidden fields, garbage).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http::{Method, Request, Response, StatusCode};
use rustle::config::ListenerKind;
use rustle_bench::pattern::{pattern, pattern_sha256_hex};
use rustle_bench::{Origin, TcpEcho, TcpServe, TlsOrigin};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::util::*;

/// A proxy with one HTTP listener that accepts h2c, and `tweak` applied.
fn h2c_proxy(tweak: impl FnOnce(&mut rustle::config::Config)) -> Proxy {
    Proxy::start_with(|cfg| {
        let mut l = listener(ListenerKind::Http, None);
        l.h2c = true;
        cfg.listeners = vec![l];
        tweak(cfg);
    })
}

/// An h2 client connection to `addr` (prior knowledge); its connection task runs on the
/// test's runtime.
async fn client(addr: SocketAddr) -> SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect to the proxy");
    tcp.set_nodelay(true).unwrap();
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake(tcp)
        .await
        .expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready().await.expect("connection ready")
}

fn request(method: Method, uri: &str) -> http::request::Builder {
    Request::builder().method(method).uri(uri)
}

/// Sends a request (with `body`, END_STREAM after it) and returns the response head and
/// its whole body.
async fn exchange(
    c: &mut SendRequest<Bytes>,
    req: Request<()>,
    body: Option<Vec<u8>>,
) -> (Response<()>, Vec<u8>) {
    let mut c = c.clone().ready().await.expect("ready");
    let (resp, mut send) = c.send_request(req, body.is_none()).expect("send request");
    if let Some(body) = body {
        let writer = tokio::spawn(async move {
            send_all(&mut send, Bytes::from(body)).await;
            send.send_data(Bytes::new(), true).expect("end of body");
        });
        let r = read_response(resp).await;
        writer.await.unwrap();
        return r;
    }
    read_response(resp).await
}

async fn read_response(resp: h2::client::ResponseFuture) -> (Response<()>, Vec<u8>) {
    let resp = tokio::time::timeout(Duration::from_secs(20), resp)
        .await
        .expect("response in time")
        .expect("response");
    let (parts, body) = resp.into_parts();
    (Response::from_parts(parts, ()), read_all(body).await)
}

async fn read_all(mut body: RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body data");
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    out
}

/// Sends all of `data` as the peer's window allows.
async fn send_all(send: &mut SendStream<Bytes>, mut data: Bytes) {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let cap = match send.capacity() {
            0 => std::future::poll_fn(|cx| send.poll_capacity(cx))
                .await
                .expect("stream open")
                .expect("capacity"),
            n => n,
        };
        let piece = data.split_to(cap.min(data.len()));
        send.send_data(piece, false).expect("send data");
    }
}

/// Waits (without blocking the test's runtime, which drives the client) for `n` access-log
/// lines satisfying `pred`.
async fn wait_log(proxy: &Proxy, n: usize, pred: impl Fn(&str) -> bool) -> Vec<String> {
    let lines = || -> Vec<String> {
        proxy.log_text().lines().filter(|l| pred(l)).map(str::to_string).collect()
    };
    let there = wait_until_async(Duration::from_secs(5), || lines().len() >= n).await;
    assert!(there, "wanted {n} matching lines; the log has:\n{}", proxy.log_text());
    lines()
}

fn sha(bytes: &[u8]) -> String {
    rustle_bench::pattern::hex(&Sha256::digest(bytes))
}

#[tokio::test]
async fn get_and_post_with_integrity() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut c = client(proxy.addr()).await;
    for path in ["/bytes/1000000", "/chunked/1000003?size=7000", "/close/300000"] {
        let n: u64 = path[1..].split(['/', '?']).nth(1).unwrap().parse().unwrap();
        let (resp, body) =
            exchange(&mut c, request(Method::GET, &origin.url(path)).body(()).unwrap(), None).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(body.len() as u64, n, "{path}");
        assert_eq!(sha(&body), pattern_sha256_hex(n), "{path}");
        assert!(
            resp.headers().get("transfer-encoding").is_none()
                && resp.headers().get("connection").is_none()
        );
    }
    // Uploads: with a content-length, and without one (chunked to the origin).
    let n = 5 * 1024 * 1024;
    let expected = format!("{} {n}", pattern_sha256_hex(n as u64));
    let req = request(Method::POST, &origin.url("/sha256"))
        .header("content-length", n.to_string())
        .body(())
        .unwrap();
    let (resp, body) = exchange(&mut c, req, Some(pattern(n))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(String::from_utf8_lossy(&body), expected);
    let req = request(Method::POST, &origin.url("/sha256")).body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, Some(pattern(n))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(String::from_utf8_lossy(&body), expected, "chunked upload");
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    // Framing names with an underscore (framing to origins that fold `_` into `-`) are
    // dropped: the framing written is the proxy's own.
    let req = request(Method::POST, &origin.url("/sha256"))
        .header("transfer_encoding", "gzip")
        .header("content_length", "1")
        .body(())
        .unwrap();
    let (resp, body) = exchange(&mut c, req, Some(pattern(n))).await;
    assert_eq!(
        (resp.status(), String::from_utf8_lossy(&body)),
        (StatusCode::OK, expected.clone().into())
    );
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert!(!head.contains("transfer_encoding") && !head.contains("content_length"), "{head}");
    // A GET whose END_STREAM comes in an empty DATA frame still goes out without a body.
    let req =
        request(Method::GET, &origin.url("/headers")).header("cookie", "a=1").body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, Some(Vec::new())).await;
    assert_eq!(resp.status(), 200);
    let head = String::from_utf8_lossy(&body).to_ascii_lowercase();
    assert!(head.starts_with("get /headers http/1.1\r\nhost: 127.0.0.1:"), "{head}");
    assert!(!head.contains("transfer-encoding") && !head.contains("content-length"), "{head}");
    // One access-log line per stream.
    let line = proxy.log_line(|l| l.contains("POST") && l.contains("/sha256"));
    let l = LogLine::parse(&line);
    assert_eq!((l.status, l.up), (200, n as u64), "{line}");
    assert_eq!(origin.requests(), 7);
}

#[tokio::test]
async fn hundred_concurrent_streams() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let c = client(proxy.addr()).await;
    let mut tasks = Vec::new();
    for i in 0..100u64 {
        let mut c = c.clone();
        let url = origin.url(&format!("/bytes/{}", 10_000 + i));
        tasks.push(tokio::spawn(async move {
            let (resp, body) =
                exchange(&mut c, request(Method::GET, &url).body(()).unwrap(), None).await;
            assert_eq!(resp.status(), 200);
            assert_eq!(sha(&body), pattern_sha256_hex(10_000 + i));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(origin.requests(), 100);
    // The origin connections went back to the pool: a second round reuses them.
    let before = origin.connections();
    let mut c2 = c.clone();
    let (resp, _) =
        exchange(&mut c2, request(Method::GET, &origin.url("/bytes/1")).body(()).unwrap(), None)
            .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(origin.connections(), before, "a pooled origin connection was not reused");
}

/// The connection's writes are gathered and sent once per wakeup, except large ones with
/// nothing gathered: bulk tunnel frames and many small answers interleaved on one
/// connection must all arrive whole and in order.
#[tokio::test]
async fn a_bulk_tunnel_and_many_small_answers_share_a_connection_intact() {
    let payload = pattern(20 * 1024 * 1024);
    let server = TcpServe::start_with(payload.clone()).unwrap();
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut c = client(proxy.addr()).await;
    let (status, mut send, recv) = open_tunnel(&mut c, &server.addr().to_string()).await;
    assert_eq!(status, 200);
    send.send_data(Bytes::new(), true).unwrap();
    // Read slowly, so the tunnel's frames keep coming while the small answers do.
    let bulk = tokio::spawn(async move {
        let mut recv = recv;
        let mut got = Vec::new();
        while let Some(chunk) = recv.data().await {
            let chunk = chunk.expect("tunnel data");
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
            // The scenario: a slow reader (see above).
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        got
    });
    let mut small = Vec::new();
    for i in 0..300u64 {
        let mut c = c.clone();
        let n = if i % 50 == 0 { 60_000 + i } else { 1 + i * 7 };
        let url = origin.url(&format!("/bytes/{n}"));
        small.push(tokio::spawn(async move {
            let (resp, body) =
                exchange(&mut c, request(Method::GET, &url).body(()).unwrap(), None).await;
            assert_eq!(resp.status(), 200);
            assert_eq!(sha(&body), pattern_sha256_hex(n), "/bytes/{n}");
        }));
    }
    for t in small {
        tokio::time::timeout(Duration::from_secs(30), t).await.expect("in time").unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(30), bulk).await.expect("in time").unwrap();
    assert!(got == payload, "tunnel bytes corrupted ({} of {} bytes)", got.len(), payload.len());
    let _send = send;
}

/// A CONNECT stream: the response and both halves of the stream.
async fn open_tunnel(
    c: &mut SendRequest<Bytes>,
    authority: &str,
) -> (StatusCode, SendStream<Bytes>, RecvStream) {
    let req = Request::builder().method(Method::CONNECT).uri(authority).body(()).unwrap();
    let mut c = c.clone().ready().await.expect("ready");
    let (resp, send) = c.send_request(req, false).expect("send CONNECT");
    let resp = tokio::time::timeout(Duration::from_secs(20), resp)
        .await
        .expect("in time")
        .expect("response");
    let status = resp.status();
    (status, send, resp.into_body())
}

/// A CONNECT stream as a byte stream, for a TLS client on top.
struct StreamIo {
    send: SendStream<Bytes>,
    recv: RecvStream,
    buf: Bytes,
}

impl AsyncRead for StreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            match std::task::ready!(this.recv.poll_data(cx)) {
                Some(Ok(b)) => {
                    let _ = this.recv.flow_control().release_capacity(b.len());
                    this.buf = b;
                }
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = this.buf.len().min(out.remaining());
        out.put_slice(&this.buf.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for StreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.send.reserve_capacity(data.len());
        let cap = match this.send.capacity() {
            0 => match std::task::ready!(this.send.poll_capacity(cx)) {
                Some(Ok(n)) => n,
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
                None => return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
            },
            n => n,
        };
        let n = cap.min(data.len());
        this.send
            .send_data(Bytes::copy_from_slice(&data[..n]), false)
            .map_err(std::io::Error::other)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let _ = self.get_mut().send.send_data(Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn connect_to_a_tls_origin_moves_50mb_intact() {
    let origin = TlsOrigin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut c = client(proxy.addr()).await;
    let (status, send, recv) =
        open_tunnel(&mut c, &format!("localhost:{}", origin.addr().port())).await;
    assert_eq!(status, 200);
    let connector = tokio_rustls::TlsConnector::from(origin.client_config().unwrap());
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let io = StreamIo { send, recv, buf: Bytes::new() };
    let mut tls = connector.connect(name, io).await.expect("TLS through the tunnel");
    let n = 50 * 1024 * 1024u64;
    let req = format!("GET /bytes/{n} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.unwrap();
    let start = Instant::now();
    let mut got = Vec::with_capacity(n as usize + 1024);
    let _ = tls.read_to_end(&mut got).await;
    let took = start.elapsed();
    let end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("response head") + 4;
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got[..end]));
    assert_eq!((got.len() - end) as u64, n);
    assert_eq!(sha(&got[end..]), pattern_sha256_hex(n), "tunnelled body corrupted");
    eprintln!("50 MB through an h2 CONNECT stream + TLS in {took:?}");
    // Dropping both halves resets the stream; the tunnel then logs.
    drop(tls);
    let line = wait_log(&proxy, 1, |l| l.contains("CONNECT")).await.remove(0);
    let l = LogLine::parse(&line);
    assert_eq!(l.status, 200, "{line}");
    assert!(l.down > n, "{line}");
}

#[tokio::test]
async fn connect_half_close_both_ways() {
    // END_STREAM from the client becomes a FIN: the server answers only after EOF.
    let payload = pattern(1024 * 1024);
    let server = TcpServe::start_with(payload.clone()).unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut c = client(proxy.addr()).await;
    let (status, mut send, recv) = open_tunnel(&mut c, &server.addr().to_string()).await;
    assert_eq!(status, 200);
    send.send_data(Bytes::from_static(b"some request bytes"), true).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), read_all(recv)).await.expect("in time");
    assert!(got == payload, "payload corrupted ({} bytes)", got.len());
    assert_eq!(server.bytes_in(), 18);

    // The echo server's FIN (after ours) ends the stream; everything sent came back.
    let echo = TcpEcho::start().unwrap();
    let (status, mut send, recv) = open_tunnel(&mut c, &echo.addr().to_string()).await;
    assert_eq!(status, 200);
    let data = pattern(3 * 1024 * 1024);
    let to_send = Bytes::from(data.clone());
    let writer = tokio::spawn(async move {
        send_all(&mut send, to_send).await;
        send.send_data(Bytes::new(), true).unwrap();
        send
    });
    let got = tokio::time::timeout(Duration::from_secs(20), read_all(recv)).await.expect("in time");
    let _send = writer.await.unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "echoed bytes differ");
}

#[tokio::test]
async fn many_tunnels_on_one_connection_and_a_reset_closes_the_upstream() {
    let echo = TcpEcho::start().unwrap();
    let proxy = h2c_proxy(|c| c.http2.max_concurrent_streams = 400);
    let mut c = client(proxy.addr()).await;
    let mut tunnels = Vec::new();
    // More tunnels than the client's connection window has room for 64 KiB each: a quiet
    // tunnel must not keep window it does not use.
    for _ in 0..300 {
        let (status, send, recv) = open_tunnel(&mut c, &echo.addr().to_string()).await;
        assert_eq!(status, 200);
        tunnels.push((send, recv));
    }
    for (i, (send, recv)) in tunnels.iter_mut().enumerate() {
        let msg = Bytes::from(format!("hello {i}"));
        send.send_data(msg.clone(), false).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), recv.data())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(got, msg);
    }
    assert_eq!(echo.connections(), 300);
    for (mut send, _) in tunnels {
        send.send_reset(h2::Reason::CANCEL);
    }
    // Each reset tunnel writes its log line when the proxy has closed its upstream.
    wait_log(&proxy, 300, |l| l.contains("CONNECT")).await;
}

/// One masked client WebSocket frame (RFC 6455 5.2).
fn ws_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// A client whose connection has seen the proxy's SETTINGS_ENABLE_CONNECT_PROTOCOL.
async fn websocket_client(addr: SocketAddr) -> SendRequest<Bytes> {
    let c = client(addr).await;
    // The server's SETTINGS may not have been read yet.
    wait_until_async(Duration::from_secs(5), || c.is_extended_connect_protocol_enabled()).await;
    assert!(
        c.is_extended_connect_protocol_enabled(),
        "SETTINGS_ENABLE_CONNECT_PROTOCOL not offered"
    );
    c
}

/// An RFC 8441 WebSocket request for `url`.
fn websocket_request(url: &str) -> Request<()> {
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri(url)
        .header("sec-websocket-version", "13")
        .body(())
        .unwrap();
    req.extensions_mut().insert(h2::ext::Protocol::from("websocket"));
    req
}

#[tokio::test]
async fn websocket_over_extended_connect_echoes() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut c = websocket_client(proxy.addr()).await;
    let req = websocket_request(&origin.url("/ws"));
    let (resp, mut send) = c.send_request(req, false).expect("send extended CONNECT");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut recv = resp.into_body();
    let mut got = Vec::new();
    for msg in [&b"hello"[..], &pattern(1000)] {
        send.send_data(Bytes::from(ws_frame(0x2, msg)), false).unwrap();
        let want = 2 + if msg.len() < 126 { 0 } else { 2 } + msg.len();
        while got.len() < want {
            let chunk = tokio::time::timeout(Duration::from_secs(10), recv.data())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        let frame: Vec<u8> = got.drain(..want).collect();
        assert_eq!(frame[0], 0x82, "a final binary frame");
        assert_eq!(&frame[want - msg.len()..], msg, "echoed payload");
    }
    assert_eq!(origin.ws_messages(), 2);
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert!(head.starts_with("get /ws http/1.1\r\n"), "{head}");
    assert!(head.contains("upgrade: websocket") && head.contains("sec-websocket-key: "), "{head}");
    assert!(head.contains("sec-websocket-version: 13"), "{head}");

    // An unknown :protocol is refused on its stream.
    let mut req =
        Request::builder().method(Method::CONNECT).uri(origin.url("/ws")).body(()).unwrap();
    req.extensions_mut().insert(h2::ext::Protocol::from("bogus"));
    let (resp, _body) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 400);
}

/// `:scheme ws` on a WebSocket stream is taken as `http` (as HTTP/1.1 takes ws://);
/// `https`/`wss` and plain requests naming ws get a 400 that says why.
#[tokio::test]
async fn websocket_schemes_over_extended_connect() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut c = websocket_client(proxy.addr()).await;
    let ws = origin.url("/ws").replacen("http://", "ws://", 1);
    let (resp, _send) = c.send_request(websocket_request(&ws), false).expect("send");
    assert_eq!(resp.await.expect("response").status(), 200, "{ws}");
    for (url, websocket, said) in [
        (origin.url("/ws").replacen("http://", "https://", 1), true, "TLS origin"),
        (origin.url("/ws").replacen("http://", "wss://", 1), true, "TLS origin"),
        (ws.clone(), false, "only for a websocket upgrade"),
    ] {
        let req = match websocket {
            true => websocket_request(&url),
            false => request(Method::GET, &url).body(()).unwrap(),
        };
        let (resp, body) = exchange(&mut c, req, None).await;
        assert_eq!(resp.status(), 400, "{url}");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(said), "{url}: {body}");
    }
}

#[tokio::test]
async fn a_websocket_origin_with_a_wrong_accept_gets_502() {
    // An origin that upgrades without proving it read the key.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let origin = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let _ = s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Accept: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        );
        let _ = s.read(&mut byte);
        String::from_utf8_lossy(&head).into_owned()
    });
    let proxy = h2c_proxy(|_| {});
    let mut c = websocket_client(proxy.addr()).await;
    let req = websocket_request(&format!("http://{addr}/ws"));
    let (resp, _body) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 502);
    let head = origin.join().unwrap().to_ascii_lowercase();
    assert!(head.contains("sec-websocket-key: "), "{head}");
}

#[tokio::test]
async fn authentication_and_rules_apply_per_stream() {
    let origin = Origin::start().unwrap();
    let denied_port = closed_port().port();
    let text = format!(
        "{}[[rule]]\nname = \"no-closed\"\naction = \"deny\"\nports = [\"{denied_port}\"]\n",
        auth_http_config(""),
    );
    let proxy = Proxy::from_toml(&text.replace("auth = true\n", "auth = true\nh2c = true\n"));
    let mut c = client(proxy.addr()).await;
    let url = origin.url("/bytes/10");
    // No credentials: 407 with the realm, on this stream only.
    let (resp, body) = exchange(&mut c, request(Method::GET, &url).body(()).unwrap(), None).await;
    assert_eq!(resp.status(), 407, "{}", String::from_utf8_lossy(&body));
    assert_eq!(resp.headers()["proxy-authenticate"], "Basic realm=\"rustle\"");
    let auth = format!("Basic {}", base64(b"alice:secret"));
    let (resp, body) = exchange(
        &mut c,
        request(Method::GET, &url).header("proxy-authorization", &auth).body(()).unwrap(),
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(body.len(), 10);
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert!(!head.contains("proxy-authorization"), "credentials were forwarded: {head}");
    // Wrong password on a CONNECT stream: 407.
    let bad = format!("Basic {}", base64(b"alice:nope"));
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri("127.0.0.1:9")
        .header("proxy-authorization", &bad)
        .body(())
        .unwrap();
    let (resp, _) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 407);
    // Another user on the same connection is refused, as on HTTP/1.1.
    let bob = format!("Basic {}", base64(b"bob:hunter2"));
    let (resp, _) = exchange(
        &mut c,
        request(Method::GET, &url).header("proxy-authorization", &bob).body(()).unwrap(),
        None,
    )
    .await;
    assert_eq!(resp.status(), 407);
    // A rule: 403 naming it.
    let denied = format!("http://127.0.0.1:{denied_port}/");
    let req = request(Method::GET, &denied).header("proxy-authorization", &auth).body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 403);
    assert!(
        String::from_utf8_lossy(&body).contains("no-closed"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let line = proxy.log_line(|l| l.contains(" 403 "));
    assert!(line.contains("user=alice") && !line.contains("secret"), "{line}");
    assert!(!proxy.log_text().contains("c2VjcmV0"), "credentials in the log");
}

#[tokio::test]
async fn https_scheme_is_fetched_over_tls_and_bad_authorities_get_400() {
    let tls_origin = TlsOrigin::start().unwrap();
    let ca = tls_origin.ca_file();
    let proxy = h2c_proxy(|cfg| cfg.tls.origin_ca = Some(ca));
    let mut c = client(proxy.addr()).await;
    let url = tls_origin.url("/bytes/30000");
    for _ in 0..2 {
        let (resp, body) =
            exchange(&mut c, request(Method::GET, &url).body(()).unwrap(), None).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(body, pattern(30_000));
    }
    assert_eq!(tls_origin.connections(), 1, "the TLS origin connection was not pooled");
    // An origin whose certificate the proxy cannot verify: 502 naming why.
    let other = TlsOrigin::start().unwrap();
    let (resp, body) =
        exchange(&mut c, request(Method::GET, &other.url("/")).body(()).unwrap(), None).await;
    assert_eq!(resp.status(), 502);
    assert!(String::from_utf8_lossy(&body).contains("UnknownIssuer"), "{body:?}");
    let req = Request::builder().method(Method::CONNECT).uri("127.0.0.1").body(()).unwrap();
    let (resp, _) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 400, "CONNECT without a port");
    let target = closed_port();
    let req = Request::builder().method(Method::CONNECT).uri(target.to_string()).body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 502);
    assert!(String::from_utf8_lossy(&body).contains("refused"));
}

#[test]
fn a_preface_without_h2c_is_an_http1_error() {
    let proxy = Proxy::start();
    let got = raw(&proxy, PREFACE_BYTES);
    assert!(
        got.starts_with(b"HTTP/1.1 505") || got.starts_with(b"HTTP/1.1 400"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

// ---- hand-written frames ----

const PREFACE_BYTES: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

const PROTOCOL_ERROR: u32 = 0x1;
const REFUSED_STREAM: u32 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A header block of literal fields without indexing (no Huffman).
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0);
        hpack_int(&mut out, 0, 7, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, 0, 7, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// A raw connection that has sent the preface and an empty SETTINGS frame.
fn raw_h2(addr: SocketAddr) -> std::net::TcpStream {
    let mut s = connect(addr);
    let mut hello = PREFACE_BYTES.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&hello).unwrap();
    s
}

/// Reads frames until `want` matches one (returned as type, flags, stream, payload), or
/// the connection ends (None).
fn read_frame_until(
    s: &mut std::net::TcpStream,
    mut want: impl FnMut(u8, u8, u32, &[u8]) -> bool,
) -> Option<(u8, u32, Vec<u8>)> {
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).is_err() {
            return None;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            return None;
        }
        if head[3] == SETTINGS && head[4] & 1 == 0 {
            // Acknowledge the server's settings like a real client.
            let _ = s.write_all(&frame(SETTINGS, 1, 0, &[]));
        }
        if want(head[3], head[4], stream, &payload) {
            return Some((head[3], stream, payload));
        }
    }
}

/// The error code of the GOAWAY the proxy sends, if it sends one.
fn goaway_code(s: &mut std::net::TcpStream) -> Option<u32> {
    let (_, _, p) = read_frame_until(s, |t, _, _, _| t == GOAWAY)?;
    Some(u32::from_be_bytes([p[4], p[5], p[6], p[7]]))
}

fn connect_block(target: SocketAddr) -> Vec<u8> {
    hpack(&[(":method", "CONNECT"), (":authority", &target.to_string())])
}

#[test]
fn rapid_reset_gets_goaway_enhance_your_calm() {
    let echo = TcpEcho::start().unwrap();
    let proxy = h2c_proxy(|c| {
        c.http2.max_resets = 50;
        c.http2.max_pending_accept_reset_streams = 1000;
    });
    let mut s = raw_h2(proxy.addr());
    let block = connect_block(echo.addr());
    let mut burst = Vec::new();
    for i in 0..200u32 {
        let id = 2 * i + 1;
        burst.extend(frame(HEADERS, END_HEADERS, id, &block));
        burst.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let _ = s.write_all(&burst);
    assert_eq!(goaway_code(&mut s), Some(ENHANCE_YOUR_CALM));
}

#[test]
fn ping_and_settings_floods_get_goaway() {
    let proxy = h2c_proxy(|c| {
        c.http2.max_pings = 20;
        c.http2.max_settings = 20;
    });
    for kind in [PING, SETTINGS] {
        let mut s = raw_h2(proxy.addr());
        let payload: &[u8] = if kind == PING { &[0; 8] } else { &[] };
        let flood: Vec<u8> = (0..100).flat_map(|_| frame(kind, 0, 0, payload)).collect();
        let _ = s.write_all(&flood);
        assert_eq!(goaway_code(&mut s), Some(ENHANCE_YOUR_CALM), "frame type {kind}");
    }
}

/// Ten thousand PINGs (or SETTINGS) in one write get no more answers than the limit
/// allows: the limit holds per frame, not per read.
#[test]
fn a_flood_in_one_write_gets_at_most_the_limit_of_answers() {
    let limit = 100;
    let proxy = h2c_proxy(|c| {
        c.http2.max_pings = limit;
        c.http2.max_settings = limit;
    });
    for kind in [PING, SETTINGS] {
        let mut s = raw_h2(proxy.addr());
        let payload: &[u8] = if kind == PING { &[0; 8] } else { &[] };
        let flood: Vec<u8> = (0..10_000).flat_map(|_| frame(kind, 0, 0, payload)).collect();
        // The proxy may close before it has read all of it.
        let writer = {
            let mut s = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let _ = s.write_all(&flood);
            })
        };
        let mut acks = 0u32;
        let mut code = None;
        let _ = read_frame_until(&mut s, |t, flags, _, p| {
            if t == kind && flags & 1 == 1 {
                acks += 1;
            }
            if t == GOAWAY {
                code = Some(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
            }
            false
        });
        writer.join().unwrap();
        // (The raw client's first SETTINGS counts among the SETTINGS.)
        assert!(acks <= limit, "frame type {kind}: {acks} acknowledgements, limit {limit}");
        assert_eq!(code, Some(ENHANCE_YOUR_CALM), "frame type {kind} ({acks} acknowledgements)");
    }
}

#[test]
fn streams_over_the_limit_are_refused() {
    let echo = TcpEcho::start().unwrap();
    let proxy = h2c_proxy(|c| c.http2.max_concurrent_streams = 2);
    let mut s = raw_h2(proxy.addr());
    let block = connect_block(echo.addr());
    for id in [1u32, 3, 5] {
        s.write_all(&frame(HEADERS, END_HEADERS, id, &block)).unwrap();
    }
    let (_, stream, payload) =
        read_frame_until(&mut s, |t, _, _, _| t == RST_STREAM).expect("a reset");
    assert_eq!(stream, 5);
    let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
    assert!(code == REFUSED_STREAM || code == PROTOCOL_ERROR, "code {code}");
}

#[tokio::test]
async fn oversized_header_lists_get_431() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|c| c.http2.max_header_list_size = 4096);
    let mut c = client(proxy.addr()).await;
    let big = "x".repeat(8000);
    let req = request(Method::GET, &origin.url("/bytes/5")).header("x-big", &big).body(()).unwrap();
    let (resp, _) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 431);
    // The connection goes on.
    let req = request(Method::GET, &origin.url("/bytes/5")).body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, None).await;
    assert_eq!((resp.status(), body), (StatusCode::OK, pattern(5)));
}

#[test]
fn connection_specific_fields_reset_only_their_stream() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut s = raw_h2(proxy.addr());
    let authority = origin.addr().to_string();
    let base = [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", authority.as_str()),
        (":path", "/bytes/5"),
    ];
    let mut bad: Vec<(&str, &str)> = base.to_vec();
    bad.push(("connection", "keep-alive"));
    s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &hpack(&bad))).unwrap();
    let mut te: Vec<(&str, &str)> = base.to_vec();
    te.push(("te", "gzip"));
    s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 3, &hpack(&te))).unwrap();
    // CONNECT with :path is malformed (RFC 9113 8.5).
    let connect = hpack(&[(":method", "CONNECT"), (":authority", &authority), (":path", "/")]);
    s.write_all(&frame(HEADERS, END_HEADERS, 5, &connect)).unwrap();
    let mut reset = Vec::new();
    while reset.len() < 3 {
        let (_, stream, p) =
            read_frame_until(&mut s, |t, _, _, _| t == RST_STREAM).expect("resets");
        assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), PROTOCOL_ERROR);
        reset.push(stream);
    }
    reset.sort();
    assert_eq!(reset, [1, 3, 5]);
    // The connection goes on: a good request on it is answered.
    s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 7, &hpack(&base))).unwrap();
    let (_, _, body) =
        read_frame_until(&mut s, |t, _, id, _| t == DATA && id == 7).expect("response body");
    assert_eq!(body, &pattern(5)[..]);
}

#[tokio::test]
async fn a_protocol_error_closes_only_its_connection() {
    let echo = TcpEcho::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut c = client(proxy.addr()).await;
    let (status, mut send, mut recv) = open_tunnel(&mut c, &echo.addr().to_string()).await;
    assert_eq!(status, 200);
    let addr = proxy.addr();
    let code = tokio::task::spawn_blocking(move || {
        let mut s = raw_h2(addr);
        // DATA on stream 0 is a connection error (RFC 9113 6.1).
        s.write_all(&frame(DATA, 0, 0, b"nonsense")).unwrap();
        goaway_code(&mut s)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(PROTOCOL_ERROR));
    send.send_data(Bytes::from_static(b"still here"), false).unwrap();
    let got =
        tokio::time::timeout(Duration::from_secs(10), recv.data()).await.unwrap().unwrap().unwrap();
    assert_eq!(&got[..], b"still here");
}

#[tokio::test]
async fn h2c_on_an_auto_listener() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|cfg| {
        let mut l = listener(ListenerKind::Auto, None);
        l.h2c = true;
        cfg.listeners = vec![l];
    });
    let mut c = client(proxy.addr()).await;
    let (resp, body) =
        exchange(&mut c, request(Method::GET, &origin.url("/bytes/100")).body(()).unwrap(), None)
            .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(body, pattern(100));
}

/// 10,000 idle CONNECT streams on one connection, against the real binary (its own fd
/// limit): prints the proxy's resident memory. Run with `--ignored --nocapture`.
#[tokio::test]
#[ignore = "opens 10,000 upstream connections; run by hand for the memory figure"]
async fn ten_thousand_idle_connect_streams_memory() {
    let streams: usize =
        std::env::var("H2_STREAMS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let echo = TcpEcho::start().unwrap();
    let dir = TempDir::new("h2mem");
    let config = dir.file("rustle.toml");
    std::fs::write(
        &config,
        "workers = 1\n[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n[log]\naccess = \"stderr\"\n\
         [http2]\nmax_concurrent_streams = 20000\n[limits]\nmax_connections = 20000\n",
    )
    .unwrap();
    // RUSTLE_BIN=target/release/rustle measures a release build (the default is the
    // debug binary the tests built).
    let (mut p, addr) = match std::env::var("RUSTLE_BIN") {
        Ok(bin) => RustleProcess::start_bin(&bin, &["--config", config.to_str().unwrap()]),
        Err(_) => RustleProcess::start(&["--config", config.to_str().unwrap()]),
    };
    let pid = p.child.id();
    let rss = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let before = rss();
    let mut c = client(addr).await;
    let mut tunnels = Vec::with_capacity(streams);
    let start = Instant::now();
    for i in 0..streams {
        let (status, send, recv) = open_tunnel(&mut c, &echo.addr().to_string()).await;
        assert_eq!(status, 200, "tunnel {i}");
        tunnels.push((send, recv));
    }
    let opened = start.elapsed();
    // Every tunnel works (one byte each way), then idles.
    for (send, recv) in tunnels.iter_mut() {
        send.send_data(Bytes::from_static(b"x"), false).unwrap();
        let got = match recv.data().await.unwrap() {
            Ok(got) => got,
            Err(e) => {
                // Its whole stderr: the process ended, its reader thread done.
                let _ = p.child.kill();
                p.wait(Duration::from_secs(5));
                panic!("{e}; proxy stderr:\n{}", p.stderr())
            }
        };
        let _ = recv.flow_control().release_capacity(got.len());
    }
    // The scenario: the streams idle a while (past a housekeeping sweep, which trims idle
    // buffers) before the memory they hold is measured.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss();
    eprintln!(
        "{streams} idle CONNECT streams on one h2c connection: proxy VmRSS {} KiB before, {} KiB \
         after ({:.0} bytes per stream), opened in {opened:?}",
        before,
        after,
        (after - before) as f64 * 1024.0 / streams as f64
    );
    assert!(after < 30 * 1024, "VmRSS {after} KiB is over 30 MB");
    drop(tunnels);
    let _ = p.child.kill();
}

/// nghttp (nghttp2-client) over h2c with prior knowledge: it has no proxy mode, but an
/// `:authority` given with -H names the origin while the connection goes to the proxy.
#[test]
fn nghttp_gets_and_posts_through_the_proxy() {
    if !have("nghttp") {
        return;
    }
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let authority = format!(":authority: {}", origin.addr());
    let url = |path: &str| format!("http://{}{path}", proxy.addr());
    let n = 1_000_000u64;
    let out = clean_command("nghttp")
        .args(["-H", &authority, &url(&format!("/bytes/{n}"))])
        .output()
        .expect("run nghttp");
    assert_success("nghttp GET", &out);
    assert_eq!(sha(&out.stdout), pattern_sha256_hex(n), "{} bytes", out.stdout.len());
    let dir = TempDir::new("nghttp");
    let file = dir.file("upload");
    std::fs::write(&file, pattern(300_000)).unwrap();
    let out = clean_command("nghttp")
        .args(["-H", &authority, "-d", file.to_str().unwrap(), &url("/sha256")])
        .output()
        .expect("run nghttp");
    assert_success("nghttp POST", &out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{} 300000", pattern_sha256_hex(300_000))
    );
    let line = proxy.log_line(|l| l.contains("POST"));
    assert!(line.contains(&format!("http://{}/sha256 200 300000 ", origin.addr())), "{line}");
}

/// One bulk download through an h2 CONNECT stream and through an HTTP/1.1 CONNECT tunnel
/// of the same proxy process (`RUSTLE_BIN` for a release build): prints both rates.
#[tokio::test]
#[ignore = "a measurement; run by hand with --ignored --nocapture"]
async fn tunnel_throughput_h2_vs_http1() {
    let n: u64 = std::env::var("H2_BYTES").ok().and_then(|s| s.parse().ok()).unwrap_or(1 << 30);
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("h2tput");
    let config = dir.file("rustle.toml");
    std::fs::write(
        &config,
        "workers = 1\n[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n[log]\naccess = \"off\"\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let (_p, addr) = match std::env::var("RUSTLE_BIN") {
        Ok(bin) => RustleProcess::start_bin(&bin, &args),
        Err(_) => RustleProcess::start(&args),
    };
    let req =
        format!("GET /bytes/{n} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", origin.addr());
    for round in 0..2 {
        // HTTP/1.1 CONNECT, read by a blocking thread.
        let target = origin.addr().to_string();
        let origin_addr = origin.addr();
        let (got, took) = tokio::task::spawn_blocking(move || {
            let (c, r) = connect_with(addr, &target, &[]);
            assert_eq!(r.status, 200);
            let mut s = c.s;
            timed_download(&mut s, origin_addr, n)
        })
        .await
        .unwrap();
        assert_eq!(got as u64, n);
        let h1 = n as f64 / took.as_secs_f64() / 1e6;
        // h2 CONNECT.
        let mut c = client(addr).await;
        let (status, mut send, mut recv) = open_tunnel(&mut c, &origin.addr().to_string()).await;
        assert_eq!(status, 200);
        let start = Instant::now();
        send.send_data(Bytes::from(req.clone()), false).unwrap();
        let mut total = 0u64;
        while let Some(chunk) = recv.data().await {
            let chunk = chunk.unwrap();
            let _ = recv.flow_control().release_capacity(chunk.len());
            total += chunk.len() as u64;
        }
        let took = start.elapsed();
        assert!(total > n);
        let h2 = n as f64 / took.as_secs_f64() / 1e6;
        eprintln!(
            "round {round}: {n} bytes through one tunnel: HTTP/1.1 CONNECT {h1:.0} MB/s, h2 \
             CONNECT {h2:.0} MB/s ({:.0}%)",
            100.0 * h2 / h1
        );
    }
}

/// A proxy with an HTTPS listener (certificate for localhost) and `extra` TOML.
fn https_proxy(dir: &TempDir, extra: &str) -> (Proxy, std::path::PathBuf) {
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("certs")).unwrap();
    let toml = format!(
        "{extra}\n[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\n{}\n[listener.tls]\n\
         cert = \"{}\"\nkey = \"{}\"\n",
        if extra.contains("[[auth.user]]") { "auth = true" } else { "" },
        files.chain.display(),
        files.key.display()
    );
    (Proxy::from_toml(&toml), files.ca)
}

/// An h2 client over TLS (ALPN h2) to `addr`, trusting `ca`.
async fn tls_client(addr: SocketAddr, ca: &std::path::Path) -> SendRequest<Bytes> {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "ALPN did not choose h2");
    let (send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready().await.expect("connection ready")
}

#[tokio::test]
async fn http2_over_the_tls_port_with_alpn() {
    let dir = TempDir::new("h2-tls");
    let (proxy, ca) = https_proxy(&dir, "");
    let origin = Origin::start().unwrap();
    let tls_origin = TlsOrigin::start().unwrap();
    let mut c = tls_client(proxy.addr(), &ca).await;
    let (resp, body) =
        exchange(&mut c, request(Method::GET, &origin.url("/bytes/70000")).body(()).unwrap(), None)
            .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(body, pattern(70_000));
    // A CONNECT stream inside the TLS connection, with the origin's TLS inside it.
    let (status, send, recv) = open_tunnel(&mut c, &tls_origin.addr().to_string()).await;
    assert_eq!(status, 200);
    let io = StreamIo { send, recv, buf: Bytes::new() };
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls_origin.client_config().unwrap());
    let mut inner = connector.connect(name, io).await.expect("TLS in the tunnel");
    inner
        .write_all(b"GET /bytes/5000 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = inner.read_to_end(&mut got).await;
    let resp = parse_response(&got);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, pattern(5000));
    let lines = wait_log(&proxy, 1, |l| l.contains("GET http://")).await;
    assert!(lines[0].contains("tls=TLSv1_3/"), "{}", lines[0]);
}

#[tokio::test]
async fn http2_over_tls_asks_for_credentials_per_stream() {
    let dir = TempDir::new("h2-tls-auth");
    let users = "[[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n";
    let (proxy, ca) = https_proxy(&dir, users);
    let origin = Origin::start().unwrap();
    let mut c = tls_client(proxy.addr(), &ca).await;
    let url = origin.url("/bytes/3");
    let (resp, _) = exchange(&mut c, request(Method::GET, &url).body(()).unwrap(), None).await;
    assert_eq!(resp.status(), 407);
    let auth = format!("Basic {}", base64(b"alice:secret"));
    let req = request(Method::GET, &url).header("proxy-authorization", auth).body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(body, pattern(3));
    let lines = wait_log(&proxy, 1, |l| l.contains("user=alice")).await;
    assert!(lines[0].contains("tls="), "{}", lines[0]);
    drop(proxy);
}

/// nghttp negotiates h2 by ALPN on the TLS port (it warns about, but accepts, the test
/// certificate).
#[test]
fn nghttp_over_the_tls_port() {
    if !have("nghttp") {
        return;
    }
    let dir = TempDir::new("nghttp-tls");
    // nghttp says `:scheme https` (its connection is TLS): the proxy fetches the URL over
    // TLS, so the origin is a TLS one the proxy trusts.
    let origin = TlsOrigin::start().unwrap();
    let extra = format!("[tls]\norigin_ca = \"{}\"\n", origin.ca_file().display());
    let (proxy, _ca) = https_proxy(&dir, &extra);
    let authority = format!(":authority: {}", origin.addr());
    let url = format!("https://localhost:{}/bytes/200000", proxy.addr().port());
    let out = clean_command("nghttp").args(["-H", &authority, &url]).output().expect("nghttp");
    assert_success("nghttp over TLS", &out);
    assert_eq!(
        sha(&out.stdout),
        pattern_sha256_hex(200_000),
        "{} bytes; stderr: {}",
        out.stdout.len(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn response_trailers_of_a_chunked_origin_reach_the_client() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let c = client(proxy.addr()).await;
    let mut c = c.ready().await.unwrap();
    let req = request(Method::GET, &origin.url("/chunked/20000?size=3000")).body(()).unwrap();
    let (resp, _) = c.send_request(req, true).expect("send");
    let resp = tokio::time::timeout(Duration::from_secs(20), resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, pattern(20_000));
    let trailers = body.trailers().await.expect("trailers").expect("some trailers");
    assert_eq!(trailers.get("x-trailer").map(|v| v.as_bytes()), Some(&b"done"[..]));
}

#[test]
fn requests_need_an_authority_that_host_agrees_with() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|_| {});
    let mut s = raw_h2(proxy.addr());
    let host = origin.addr().to_string();
    let error_body = |s: &mut std::net::TcpStream, id: u32| {
        let (_, _, body) =
            read_frame_until(s, |t, _, i, _| t == DATA && i == id).expect("error body");
        String::from_utf8_lossy(&body).into_owned()
    };
    // No :authority, only Host: h2 hides the :scheme then, so the request cannot be
    // forwarded safely; a 400 on that stream.
    let block =
        hpack(&[(":method", "GET"), (":scheme", "http"), (":path", "/bytes/7"), ("host", &host)]);
    s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &block)).unwrap();
    assert!(error_body(&mut s, 1).contains("no :authority"));
    // Both: naming different hosts is malformed; agreeing, the request is forwarded with
    // one Host line.
    let with_host = |h: &str| {
        let a = [(":method", "GET"), (":scheme", "http"), (":authority", &host)];
        hpack(&[&a[..], &[(":path", "/bytes/7"), ("host", h)]].concat())
    };
    s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 3, &with_host("elsewhere.example")))
        .unwrap();
    assert!(error_body(&mut s, 3).contains("host differs from :authority"));
    s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 5, &with_host(&host))).unwrap();
    let (_, _, body) =
        read_frame_until(&mut s, |t, _, id, _| t == DATA && id == 5).expect("response body");
    assert_eq!(body, &pattern(7)[..]);
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert_eq!(head.matches("host:").count(), 1, "{head}");
    assert_eq!(origin.requests(), 1);
}

/// Mbit/s of `bytes` beyond the buckets' initial burst (a tenth of a second's worth).
fn limited_rate(bytes: usize, mbit: f64, took: Duration) -> f64 {
    (bytes as f64 - mbit * 1e6 / 8.0 / 10.0) * 8.0 / took.as_secs_f64() / 1e6
}

#[tokio::test]
async fn bandwidth_limits_apply_to_every_kind_of_stream() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let proxy = h2c_proxy(|c| {
        c.listeners[0].rate_down = Some("8mbit".into());
        c.listeners[0].rate_up = Some("8mbit".into());
    });
    let mut c = client(proxy.addr()).await;
    let in_range = |rate: f64| (7.0..=9.0).contains(&rate);
    // A download: 1.5 MB at 8 Mbit/s (1 MB/s) is about 1.4 s after the burst.
    let n = 1_500_000;
    let start = Instant::now();
    let req = request(Method::GET, &origin.url(&format!("/bytes/{n}"))).body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, None).await;
    let rate = limited_rate(n, 8.0, start.elapsed());
    assert_eq!((resp.status(), body.len()), (StatusCode::OK, n));
    assert!(in_range(rate), "download at {rate:.2} Mbit/s, expected 8");
    // An upload.
    let start = Instant::now();
    let req = request(Method::POST, &origin.url("/sha256"))
        .header("content-length", n.to_string())
        .body(())
        .unwrap();
    let (resp, body) = exchange(&mut c, req, Some(pattern(n))).await;
    let rate = limited_rate(n, 8.0, start.elapsed());
    assert_eq!(resp.status(), 200);
    assert_eq!(String::from_utf8_lossy(&body), format!("{} {n}", pattern_sha256_hex(n as u64)));
    assert!(in_range(rate), "upload at {rate:.2} Mbit/s, expected 8");
    // A CONNECT stream to an echo server: both directions limited, the bytes intact.
    let (status, mut send, recv) = open_tunnel(&mut c, &echo.addr().to_string()).await;
    assert_eq!(status, 200);
    let data = pattern(n);
    let to_send = Bytes::from(data.clone());
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        send_all(&mut send, to_send).await;
        send.send_data(Bytes::new(), true).unwrap();
        send
    });
    let got = tokio::time::timeout(Duration::from_secs(20), read_all(recv)).await.expect("in time");
    let rate = limited_rate(n, 8.0, start.elapsed());
    let _send = writer.await.unwrap();
    assert!(got == data, "echoed bytes differ ({} of {n})", got.len());
    assert!(in_range(rate), "tunnel at {rate:.2} Mbit/s, expected 8");
}

/// An origin's Content-Length listed twice reaches an h2 client as one number (h2
/// clients refuse a list), and trailer fields that must not be trailers are left out.
#[tokio::test]
async fn an_h2_client_gets_one_content_length_and_no_forbidden_trailers() {
    let proxy = h2c_proxy(|_| {});
    let mut c = client(proxy.addr()).await;
    let origin = RawOrigin::answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello");
    let url = format!("http://{}/", origin.addr());
    let (resp, body) = exchange(&mut c, request(Method::GET, &url).body(()).unwrap(), None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let lengths: Vec<_> = resp.headers().get_all("content-length").iter().collect();
    assert_eq!(lengths, ["5"]);
    assert_eq!(body, b"hello");

    let origin = RawOrigin::answering(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\
          X-Sum: 1\r\nSet-Cookie: a=b\r\nContent-Type: text/evil\r\nCache-Control: no-store\r\n\
          Authorization: Basic eA==\r\nX-End: 2\r\n\r\n",
    );
    let url = format!("http://{}/", origin.addr());
    let mut c = c.clone().ready().await.unwrap();
    let (resp, _) = c.send_request(request(Method::GET, &url).body(()).unwrap(), true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), resp).await.unwrap().unwrap();
    let mut body = resp.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        data.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(data, b"hello");
    let trailers = body.trailers().await.unwrap().expect("trailers");
    let mut names: Vec<&str> = trailers.keys().map(|k| k.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["x-end", "x-sum"]);
}

/// An h2 client's trailers go to the origin in the last chunk, without the fields that
/// must not be trailers.
#[tokio::test]
async fn an_h2_clients_forbidden_trailers_do_not_reach_the_origin() {
    let proxy = h2c_proxy(|_| {});
    let c = client(proxy.addr()).await;
    let origin = RawOrigin::start(b"HTTP/1.1 204 No Content\r\n\r\n", |b| {
        b.windows(5).any(|w| w == b"\r\n0\r\n") && b.ends_with(b"\r\n\r\n")
    });
    let url = format!("http://{}/", origin.addr());
    let mut c = c.ready().await.unwrap();
    let (resp, mut send) =
        c.send_request(request(Method::POST, &url).body(()).unwrap(), false).unwrap();
    send.send_data(Bytes::from_static(b"hello"), false).unwrap();
    let mut trailers = http::HeaderMap::new();
    for (name, value) in [
        ("x-sum", "1"),
        ("authorization", "Basic eA=="),
        ("cache-control", "no-store"),
        ("content-type", "text/evil"),
        ("range", "bytes=0-1"),
    ] {
        trailers.insert(name, value.parse().unwrap());
    }
    send.send_trailers(trailers).unwrap();
    let (resp, _) = read_response(resp).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let seen = String::from_utf8(origin.received()).unwrap();
    let body = &seen[seen.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body, "5\r\nhello\r\n0\r\nx-sum: 1\r\n\r\n", "{seen}");
}

/// A drain cuts no request: an HTTP/1 connection kept alive and idle when it begins gets
/// its next request answered, with `Connection: close`; an HTTP/2 connection gets GOAWAY
/// and its stream in flight completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_answers_idle_kept_alive_connections_and_finishes_http2_streams() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|cfg| cfg.timeouts.shutdown = Duration::from_secs(10));
    let addr = proxy.addr();
    let mut h1 = Conn::open(addr);
    h1.send(&get(&origin.url("/bytes/10")));
    let r = h1.read_response();
    assert_eq!((r.status, r.header("connection")), (200, None), "kept alive");
    // An HTTP/2 stream in flight: the origin answers after 1.5 s.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let mut send = send.ready().await.expect("ready");
    let req = request(Method::GET, &origin.url("/delay/1500")).body(()).unwrap();
    let (resp, _) = send.send_request(req, true).expect("send request");
    let in_flight = tokio::spawn(read_response(resp));
    // In flight means at the origin: the drain begins only once the origin has the request.
    let at_origin = tokio::task::block_in_place(|| {
        wait_until(Duration::from_secs(10), || origin.requests() == 2)
    });
    assert!(at_origin, "the delayed request reached the origin");
    // An idle raw HTTP/2 connection: its GOAWAY tells that the worker drains.
    let mut raw = raw_h2(addr);
    let mut raw = tokio::task::spawn_blocking(move || {
        read_frame_until(&mut raw, |t, _, _, _| t == SETTINGS).expect("server settings");
        raw
    })
    .await
    .unwrap();
    let _ = proxy.running().stopper().send(true);
    let code = tokio::task::spawn_blocking(move || goaway_code(&mut raw)).await.unwrap();
    assert_eq!(code, Some(0), "GOAWAY NO_ERROR on an idle connection");
    // The idle HTTP/1 connection is answered, and told to close.
    let h1 = tokio::task::spawn_blocking(move || {
        h1.send(&get(&origin.url("/bytes/10")));
        let r = h1.read_response();
        assert_eq!((r.status, r.header("connection")), (200, Some("close")));
        h1.assert_closed();
        origin
    });
    let _origin = h1.await.unwrap();
    // The stream in flight completes; then the connection ends.
    let (resp, body) = in_flight.await.unwrap();
    assert_eq!((resp.status(), body.as_slice()), (StatusCode::OK, &b"ok"[..]));
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "the HTTP/2 connection stays open after its last stream");
}

#[tokio::test]
async fn the_admin_endpoint_is_refused_on_every_kind_of_stream() {
    let proxy = h2c_proxy(|cfg| cfg.admin.listen = Some("127.0.0.1:0".parse().unwrap()));
    let admin = proxy.admin_addr();
    let mut c = client(proxy.addr()).await;
    let url = format!("http://{admin}/metrics");
    let (resp, body) = exchange(&mut c, request(Method::GET, &url).body(()).unwrap(), None).await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(resp.status(), 403, "{text}");
    assert!(text.contains("own listening address") && !text.contains("# TYPE"), "{text}");
    let req = request(Method::CONNECT, &admin.to_string()).body(()).unwrap();
    let (resp, body) = exchange(&mut c, req, None).await;
    assert_eq!(resp.status(), 403, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("own listening address"));
}

/// An h2 client connection to `addr` that the proxy has accepted (it holds its place under
/// the connection limits): its PING was answered. `client` alone returns once the preface
/// is written, possibly before the proxy's accept.
async fn accepted_client(addr: SocketAddr) -> SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect to the proxy");
    tcp.set_nodelay(true).unwrap();
    let (send, mut conn) = h2::client::Builder::new()
        .initial_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake(tcp)
        .await
        .expect("h2 handshake");
    let mut ping = conn.ping_pong().expect("ping_pong");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let pong = ping.ping(h2::Ping::opaque());
    tokio::time::timeout(Duration::from_secs(10), pong).await.unwrap().expect("PING answered");
    send.ready().await.expect("connection ready")
}

/// Opens `per_conn` GET streams to `url` on each of `conns` new h2 connections, without
/// waiting for their answers. All the connections are accepted before the first stream
/// is sent: were a connection accepted after other connections' streams took the last
/// places, the proxy would refuse the whole connection at accept (a GOAWAY for stream 0).
async fn many_streams(
    addr: SocketAddr,
    conns: usize,
    per_conn: usize,
    url: &str,
) -> (Vec<SendRequest<Bytes>>, Vec<h2::client::ResponseFuture>) {
    let mut clients = Vec::new();
    for _ in 0..conns {
        clients.push(accepted_client(addr).await);
    }
    let mut pending = Vec::new();
    for c in &mut clients {
        for _ in 0..per_conn {
            *c = c.clone().ready().await.expect("ready");
            let (resp, _) =
                c.send_request(request(Method::GET, url).body(()).unwrap(), true).expect("send");
            pending.push(resp);
        }
    }
    (clients, pending)
}

/// Waits (20 s at most) until `n` of `pending` answered; returns those answers' statuses
/// and bodies, and the futures still pending.
async fn answers(
    pending: Vec<h2::client::ResponseFuture>,
    n: usize,
) -> (Vec<(StatusCode, Vec<u8>)>, usize) {
    use futures_util::StreamExt;
    let mut set: futures_util::stream::FuturesUnordered<_> = pending
        .into_iter()
        .map(|resp| async move {
            let resp = resp.await.expect("response");
            let status = resp.status();
            (status, read_all(resp.into_body()).await)
        })
        .collect();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        match tokio::time::timeout_at(deadline, set.next()).await {
            Ok(Some(answer)) => got.push(answer),
            Ok(None) => break,
            Err(_) => panic!("{} answers of the {n} expected within 20 s", got.len()),
        }
    }
    let left = set.len();
    (got, left)
}

#[tokio::test]
async fn streams_count_against_the_per_client_connection_limit() {
    let silent = rustle_bench::faulty::FaultyOrigin::start(
        rustle_bench::faulty::Fault::NeverRead,
        rustle_bench::faulty::Speak::Http,
    )
    .unwrap();
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|cfg| cfg.limits.max_connections_per_client = Some(20));
    // 4 connections (4 slots) and 120 streams to an origin that never answers: 16 get an
    // upstream, the other 104 are refused at once.
    let (_clients, pending) = many_streams(proxy.addr(), 4, 30, &silent.url("/")).await;
    let (refused, left) = answers(pending, 104).await;
    for (status, body) in &refused {
        let body = String::from_utf8_lossy(body);
        assert_eq!(*status, 503, "{body}");
        assert!(body.contains("too many connections for this client address"), "{body}");
    }
    assert_eq!(left, 16, "streams waiting on the origin");
    assert!(
        wait_until(Duration::from_secs(10), || silent.connections() == 16),
        "origin connections: {} (16 expected)",
        silent.connections()
    );
    // Another client is served meanwhile.
    let mut c = Conn::open_from("127.0.0.2", proxy.addr());
    c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/5")).as_bytes());
    assert_eq!(c.read_response().status, 200);
    proxy.log_line(|l| l.contains(" 503 ") && l.contains("for this client address"));
    assert_eq!(silent.connections(), 16, "an origin connection past the limit");
}

#[tokio::test]
async fn streams_count_against_max_connections() {
    let silent = rustle_bench::faulty::FaultyOrigin::start(
        rustle_bench::faulty::Fault::NeverRead,
        rustle_bench::faulty::Speak::Http,
    )
    .unwrap();
    let proxy = h2c_proxy(|cfg| cfg.limits.max_connections = 30);
    // 4 connections and 100 streams: 26 places left for streams.
    let (mut clients, pending) = many_streams(proxy.addr(), 4, 25, &silent.url("/")).await;
    let (refused, left) = answers(pending, 74).await;
    for (status, body) in &refused {
        let body = String::from_utf8_lossy(body);
        assert_eq!(*status, 503, "{body}");
        assert!(body.contains("too many connections"), "{body}");
    }
    assert_eq!(left, 26);
    assert!(wait_until(Duration::from_secs(10), || silent.connections() == 26));
    // The connections stay up: one more stream on them gets its own 503.
    let req = request(Method::GET, &silent.url("/")).body(()).unwrap();
    let (resp, _) = exchange(&mut clients[0], req, None).await;
    assert_eq!(resp.status(), 503, "a stream past the limit on a connection that stays up");
    assert_eq!(silent.connections(), 26);
}

/// The sibling of the CONNECT tunnel's case (`accesslog`): a CONNECT stream through a
/// parent that dies after its end of stream is logged with that cause, naming the parent.
#[tokio::test]
async fn a_connect_stream_cut_by_a_dying_parent_is_logged_with_the_cause() {
    let (parent, die) = crate::accesslog::dying_parent(false);
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n\
         [[parent]]\nname = \"frail\"\nkind = \"http\"\naddress = \"{parent}\"\n\
         [[route]]\nname = \"all\"\nvia = \"frail\"\n"
    ));
    let mut c = client(proxy.addr()).await;
    let (status, mut send, mut recv) = open_tunnel(&mut c, "origin.test:443").await;
    assert_eq!(status, 200);
    send.send_data(Bytes::from_static(b"hello"), false).unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(5), recv.data()).await.expect("in time");
    assert_eq!(&echoed.expect("data").unwrap()[..], b"hello");
    die.send(()).unwrap();
    // The parent's end of stream comes as the stream's end; what the client still sends
    // then meets the dead parent's socket.
    while !recv.is_end_stream() {
        let end = tokio::time::timeout(Duration::from_secs(5), recv.data()).await.expect("in time");
        match end {
            Some(Ok(b)) if b.is_empty() => {}
            None => break,
            other => panic!("more than the end of stream: {other:?}"),
        }
    }
    send.send_data(Bytes::from_static(b"after the parent died"), true).unwrap();
    let line = wait_log(&proxy, 1, |l| l.contains("CONNECT")).await.remove(0);
    // The quoted cause ends the line (after `route=` and `via=`).
    assert!(line.ends_with('"'), "logged as a clean end: {line}");
    assert!(line.contains("\"through parent \\\"frail\\\": upstream connection: "), "{line}");
}

/// A connection over a limit at accept is refused in HTTP/2's terms when it opens with the
/// preface: SETTINGS, then GOAWAY with last stream 0, REFUSED_STREAM and the cause (an
/// HTTP/1.1 status line would read as a frame too large), and a log line.
#[tokio::test]
async fn an_h2c_connection_over_a_limit_at_accept_gets_goaway() {
    let origin = Origin::start().unwrap();
    let proxy = h2c_proxy(|cfg| cfg.limits.max_connections_per_client = Some(1));
    let _first = accepted_client(proxy.addr()).await;
    let mut second = client(proxy.addr()).await;
    let req = request(Method::GET, &origin.url("/bytes/10")).body(()).unwrap();
    let err = match send_and_wait(&mut second, req).await {
        Err(e) => e,
        Ok(status) => panic!("a second connection was served: {status}"),
    };
    assert_eq!(err.reason(), Some(h2::Reason::REFUSED_STREAM), "{err:?}");
    assert!(err.is_go_away() && err.is_remote(), "{err:?}");
    assert!(format!("{err:?}").contains("too many connections"), "{err:?}");
    proxy.log_line(|l| l.contains(" 503 ") && l.contains("too many connections"));
    assert_eq!(origin.requests(), 0);
}

/// Sends `req` on `send` and waits for its answer's status (10 s at most).
async fn send_and_wait(
    send: &mut SendRequest<Bytes>,
    req: Request<()>,
) -> Result<StatusCode, h2::Error> {
    let wait = async {
        let mut ready = send.clone().ready().await?;
        let (resp, _) = ready.send_request(req, true)?;
        Ok(resp.await?.status())
    };
    tokio::time::timeout(Duration::from_secs(10), wait).await.expect("an answer in time")
}

#[tokio::test]
async fn a_connection_to_a_parent_told_the_client_stays_with_its_h2_connection() {
    let dir = TempDir::new("h2-pp-parent");
    let parent = Proxy::from_toml(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nproxy_protocol = \"v2\"\n\
         proxy_protocol_from = [\"127.0.0.1\"]\n",
    );
    let (proxy, ca) = https_proxy(
        &dir,
        &format!(
            "[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"{}\"\nproxy_protocol = \"v2\"\n\
             [[route]]\nname = \"all\"\nvia = \"p\"\n",
            parent.addr()
        ),
    );
    let origin = Origin::start().unwrap();
    let mut c = tls_client(proxy.addr(), &ca).await;
    for _ in 0..2 {
        let req = request(Method::GET, &origin.url("/bytes/5")).body(()).unwrap();
        let (resp, _) = exchange(&mut c, req, None).await;
        assert_eq!(resp.status(), 200);
    }
    // The parent sees the h2 client (its address and port), not the front.
    let front = wait_log(&proxy, 2, |l| l.contains("GET http://")).await;
    let client = LogLine::parse(&front[0]).client;
    let seen = wait_log(&parent, 2, |l| LogLine::parse(l).client == client).await;
    assert_eq!(seen.len(), 2, "{}", parent.log_text());
    // Pinned to the h2 connection: closed with it.
    drop(c);
    let port = parent.addr().port();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while crate::proxy_protocol::established_to(port) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a connection to the parent outlived the client"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
