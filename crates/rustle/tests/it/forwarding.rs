//! Forwarding under abuse: a request sent again after its pooled connection died is
//! written for the hop it goes to (its parent's credentials only, the log naming that
//! parent), for HTTP/1 and HTTP/2 clients; request transfer codings other than one
//! `chunked` never reach an origin; a TRACE answered here keeps the client's proxy
//! credentials to itself.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustle_bench::Origin;

use crate::util::*;

/// What a fake parent saw: one entry per request head, in order.
#[derive(Clone, Debug)]
struct Seen {
    /// The request line.
    line: String,
    /// Every `Proxy-Authorization` value the head carried.
    auth: Vec<String>,
}

/// An HTTP parent proxy in a thread of the test: it answers the first request on each
/// connection itself (`200`, its name as the body, kept alive), and closes a connection
/// on the second request without answering: every pooled connection to it dies when it
/// is used again. It records each request head it reads.
struct FakeParent {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeParent {
    fn start(name: &'static str) -> FakeParent {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let addr = serve_each(move |s| serve_parent(s, name, &log));
        FakeParent { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Listens on a port of 127.0.0.1 and serves each connection with `serve` on a thread of
/// its own; the accept thread ends with the test process (a blocked accept holds nothing
/// of a test's).
fn serve_each(serve: impl Fn(TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            let serve = serve.clone();
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

/// The next request head read from `s` (`buf` keeps what follows it), or None at the
/// end of the stream or an error.
fn next_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..i + 4).collect();
            return Some(String::from_utf8_lossy(&head).into_owned());
        }
        let mut tmp = [0u8; 4096];
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&tmp[..k]),
        }
    }
}

fn serve_parent(mut s: TcpStream, name: &str, log: &Mutex<Vec<Seen>>) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    for n in 0.. {
        let Some(head) = next_head(&mut s, &mut buf) else { return };
        let mut lines = head.split("\r\n");
        let line = lines.next().unwrap_or_default().to_string();
        let auth = lines
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.eq_ignore_ascii_case("proxy-authorization"))
            .map(|(_, v)| v.trim().to_string())
            .collect();
        log.lock().unwrap().push(Seen { line, auth });
        if n > 0 {
            // The pooled connection dies before answering.
            return;
        }
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{name}", name.len());
        if s.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// rustle whose one route goes through group `pair` of parents `a` and `b`, each with
/// its own user and password.
fn through_pair(a: &FakeParent, b: &FakeParent, listener: &str) -> Proxy {
    Proxy::from_toml(&format!(
        "{listener}\
         [[parent]]\nname = \"a\"\nkind = \"http\"\naddress = \"{}\"\nuser = \"ua\"\npassword = \"pa\"\n\
         [[parent]]\nname = \"b\"\nkind = \"http\"\naddress = \"{}\"\nuser = \"ub\"\npassword = \"pb\"\n\
         [[group]]\nname = \"pair\"\nparents = [\"a\", \"b\"]\n\
         [[route]]\nname = \"all\"\nvia = \"pair\"\n",
        a.addr, b.addr
    ))
}

/// The checks of a run of `n` requests for `http://origin.test/r{i}` through the pair:
/// each answered by the parent that the log names for it, every head that reached a
/// parent carrying that parent's credentials only, and pooled connections that died on
/// the way (requests sent again).
fn assert_each_hop_its_own(proxy: &Proxy, a: &FakeParent, b: &FakeParent, answers: &[String]) {
    let n = answers.len();
    for (parent, name, user) in [(a, "a", "ua:pa"), (b, "b", "ub:pb")] {
        let want = format!("Basic {}", base64(user.as_bytes()));
        for s in parent.seen() {
            assert!(s.line.starts_with("GET http://origin.test/r"), "parent {name} got {s:?}");
            assert_eq!(s.auth, vec![want.clone()], "parent {name} got {s:?}");
        }
    }
    let lines = proxy.log_lines_matching(n, |l| l.contains("http://origin.test/r"));
    for (i, answer) in answers.iter().enumerate() {
        let url = format!("http://origin.test/r{i} ");
        let line = lines.iter().find(|l| l.contains(&url)).expect("a log line");
        let via = line.split_whitespace().find_map(|w| w.strip_prefix("via="));
        assert_eq!(via, Some(answer.as_str()), "request {i}, answered by {answer}: {line}");
    }
    let sent = a.seen().len() + b.seen().len();
    assert!(sent > n, "no pooled connection died ({sent} heads for {n} requests)");
}

#[test]
fn a_request_sent_again_carries_the_new_parents_credentials_only() {
    let (a, b) = (FakeParent::start("a"), FakeParent::start("b"));
    let proxy = through_pair(&a, &b, "");
    let mut answers = Vec::new();
    for i in 0..12 {
        let mut c = Conn::open(proxy.addr());
        c.send(&get(&format!("http://origin.test/r{i}")));
        let r = c.read_response();
        assert_eq!(r.status, 200, "request {i}: {}{}", r.head_text(), r.text());
        answers.push(r.text());
    }
    assert_each_hop_its_own(&proxy, &a, &b, &answers);
}

#[tokio::test]
async fn an_http2_request_sent_again_carries_the_new_parents_credentials_only() {
    let (a, b) = (FakeParent::start("a"), FakeParent::start("b"));
    let proxy = through_pair(&a, &b, "[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n");
    let mut answers = Vec::new();
    for i in 0..12 {
        let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
        let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut send = send.ready().await.unwrap();
        let uri = format!("http://origin.test/r{i}");
        let req = http::Request::get(&uri).body(()).unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), resp).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200, "request {i}");
        let mut body = resp.into_body();
        let mut text = Vec::new();
        while let Some(chunk) = body.data().await {
            text.extend_from_slice(&chunk.unwrap());
        }
        answers.push(String::from_utf8(text).unwrap());
    }
    let check =
        tokio::task::spawn_blocking(move || assert_each_hop_its_own(&proxy, &a, &b, &answers));
    check.await.unwrap();
}

/// A group of an HTTP parent and a SOCKS5 one: a request whose pooled connection to the
/// HTTP parent died and that the new pick sends through the SOCKS5 parent goes to the
/// origin in origin form, with no Proxy-Authorization, and is logged through that parent.
#[test]
fn a_request_sent_again_through_a_tunnel_goes_in_origin_form() {
    let origin = RawOrigin::start();
    let a = FakeParent::start("a");
    let socks = Proxy::from_toml("[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n");
    let proxy = Proxy::from_toml(&format!(
        "[[parent]]\nname = \"a\"\nkind = \"http\"\naddress = \"{}\"\nuser = \"ua\"\npassword = \"pa\"\n\
         [[parent]]\nname = \"s\"\nkind = \"socks5\"\naddress = \"{}\"\n\
         [[group]]\nname = \"pair\"\nparents = [\"a\", \"s\"]\n\
         [[route]]\nname = \"all\"\nvia = \"pair\"\n",
        a.addr,
        socks.addr()
    ));
    let n = 12;
    let mut answered_by_a = Vec::new();
    for i in 0..n {
        let mut c = Conn::open(proxy.addr());
        c.send(&get(&format!("http://{}/r{i}", origin.addr)));
        let r = c.read_response();
        assert_eq!(r.status, 200, "request {i}: {}{}", r.head_text(), r.text());
        answered_by_a.push(r.text() == "a");
    }
    let retried = a.seen().iter().filter(|s| s.line.starts_with("GET http://")).count()
        + origin.heads().len();
    assert!(retried > n, "no pooled connection died ({retried} heads for {n} requests)");
    for head in origin.heads() {
        assert!(head.starts_with("GET /r"), "the origin got {head}");
        assert!(!head.to_ascii_lowercase().contains("proxy-authorization"), "{head}");
    }
    let lines = proxy.log_lines_matching(n, |l| l.contains("/r") && l.contains(" GET "));
    for (i, by_a) in answered_by_a.iter().enumerate() {
        let url = format!("http://{}/r{i} ", origin.addr);
        let line = lines.iter().find(|l| l.contains(&url)).expect("a log line");
        let via = line.split_whitespace().find_map(|w| w.strip_prefix("via="));
        assert_eq!(via, Some(if *by_a { "a" } else { "s" }), "request {i}: {line}");
    }
}

/// An origin in a thread of the test that answers every request `200` with an empty
/// body and records each head it reads, as received.
struct RawOrigin {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl RawOrigin {
    fn start() -> RawOrigin {
        let heads = Arc::new(Mutex::new(Vec::new()));
        let log = heads.clone();
        let addr = serve_each(move |mut s| {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let Some(head) = next_head(&mut s, &mut Vec::new()) else { return };
            log.lock().unwrap().push(head);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        });
        RawOrigin { addr, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// Request transfer codings other than one `chunked`: each is refused with a 501 whose
/// one-line body names the cause, the connection closed, and nothing reaches the origin.
#[test]
fn request_transfer_codings_other_than_chunked_never_reach_the_origin() {
    let origin = RawOrigin::start();
    let proxy = Proxy::start();
    let url = format!("http://{}/up", origin.addr);
    let body = b"5\r\nhello\r\n0\r\n\r\n";
    for fields in [
        &["Transfer-Encoding: gzip, chunked"][..],
        &["Transfer-Encoding: gzip", "Transfer-Encoding: chunked"],
        &["Transfer-Encoding: identity, chunked"],
        &["Transfer-Encoding:\tdeflate\t,\tCHUNKED\t"],
        &["Transfer-Encoding: identity", "Transfer-Encoding: CHUNKED"],
    ] {
        let mut head = format!("POST {url} HTTP/1.1\r\nHost: {}\r\n", origin.addr);
        for f in fields {
            head.push_str(f);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        let mut c = Conn::open(proxy.addr());
        c.send(head.as_bytes());
        c.send(body);
        let r = c.read_response();
        assert_eq!(r.status, 501, "{fields:?}: {}{}", r.head_text(), r.text());
        assert!(r.text().contains("transfer coding"), "{fields:?}: {}", r.text());
        assert_eq!(r.text().trim_end().lines().count(), 1, "{fields:?}: {}", r.text());
        c.assert_closed();
    }
    let lines = proxy.log_lines_matching(5, |l| l.contains(&url) && l.contains(" 501 "));
    assert_eq!(lines.len(), 5, "{}", proxy.log_text());
    // One chunked coding, however spelled, goes on in its plain spelling.
    let mut c = Conn::open(proxy.addr());
    let head = format!(
        "POST {url} HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding:\tCHUNKED\t\r\n\r\n",
        origin.addr
    );
    c.send(head.as_bytes());
    c.send(body);
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
    let heads = origin.heads();
    assert_eq!(heads.len(), 1, "what reached the origin: {heads:#?}");
    let te: Vec<&str> = heads[0]
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("transfer-encoding"))
        .collect();
    assert_eq!(te, ["Transfer-Encoding: chunked"], "{}", heads[0]);
}

/// `Transfer_Encoding` and `Content_Length` are framing to origins that fold `_` into `-`
/// (CGI and its heirs), and not to the proxy: a request carrying one is refused with a
/// 400 naming it, and never reaches the origin.
#[test]
fn framing_fields_spelled_with_an_underscore_never_reach_the_origin() {
    let origin = RawOrigin::start();
    let proxy = Proxy::start();
    let url = format!("http://{}/up", origin.addr);
    for field in ["Transfer_Encoding: chunked", "content_LENGTH: 5"] {
        let head = format!(
            "POST {url} HTTP/1.1\r\nHost: {}\r\nContent-Length: 16\r\n{field}\r\n\r\n",
            origin.addr
        );
        let mut c = Conn::open(proxy.addr());
        c.send(head.as_bytes());
        c.send(b"5\r\nhello\r\n0\r\n\r\n");
        let r = c.read_response();
        assert_eq!(r.status, 400, "{field}: {}{}", r.head_text(), r.text());
        assert!(r.text().contains("underscore"), "{field}: {}", r.text());
        c.assert_closed();
    }
    let lines = proxy.log_lines_matching(2, |l| l.contains(" 400 ") && l.contains("underscore"));
    assert_eq!(lines.len(), 2, "{}", proxy.log_text());
    assert!(origin.heads().is_empty(), "what reached the origin: {:#?}", origin.heads());
}

/// A TRACE answered here (Max-Forwards: 0) echoes the request without the client's
/// Proxy-Authorization, curl sending its credentials.
#[test]
fn a_trace_answered_here_does_not_echo_proxy_credentials() {
    let proxy = Proxy::from_toml(&auth_http_config(""));
    let url = format!("{}/trace", Origin::start().unwrap().url(""));
    let Some(out) = curl(&[
        "-s",
        "-X",
        "TRACE",
        "-H",
        "Max-Forwards: 0",
        "-H",
        "X-Trace: yes",
        "-x",
        &proxy.url(),
        "-U",
        "alice:secret",
        &url,
    ]) else {
        return;
    };
    assert_success("curl TRACE", &out);
    let echoed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(echoed.starts_with("TRACE "), "{echoed}");
    assert!(echoed.contains("X-Trace: yes\r\n"), "{echoed}");
    assert!(!echoed.to_ascii_lowercase().contains("proxy-authorization"), "{echoed}");
    assert!(!echoed.contains(&base64(b"alice:secret")), "{echoed}");
    // Raw, with the field in every position and spelling: only it goes.
    for (fields, kept) in [
        ("Proxy-Authorization: Basic YWxpY2U6c2VjcmV0\r\nX-A: 1\r\n", "X-A: 1\r\n"),
        ("X-A: 1\r\nproxy-authorization:Basic YWxpY2U6c2VjcmV0\r\n", "X-A: 1\r\n"),
    ] {
        let head = format!("TRACE {url} HTTP/1.1\r\nHost: x\r\nMax-Forwards: 0\r\n{fields}\r\n");
        let mut c = Conn::open(proxy.addr());
        c.send(head.as_bytes());
        let r = c.read_response();
        assert_eq!(r.status, 200, "{}{}", r.head_text(), r.text());
        let want = format!("TRACE {url} HTTP/1.1\r\nHost: x\r\nMax-Forwards: 0\r\n{kept}\r\n");
        assert_eq!(r.text(), want);
    }
}

/// An origin in a thread of the test that authenticates connections, as NTLM and
/// Negotiate do: `Authorization: SCHEME hello` is answered 401 with a challenge,
/// `Authorization: SCHEME user=NAME` authenticates the connection as NAME, and from then
/// on every request on that connection gets NAME's private page, with or without
/// credentials; any other request gets a 401. It counts the authenticated connections
/// that ended.
struct ConnAuthOrigin {
    addr: SocketAddr,
    ended: Arc<std::sync::atomic::AtomicUsize>,
}

impl ConnAuthOrigin {
    fn start() -> ConnAuthOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = ended.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                let count = count.clone();
                std::thread::spawn(move || {
                    if conn_auth_origin(s) {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        ConnAuthOrigin { addr, ended }
    }

    fn ended(&self) -> usize {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Serves one connection; true when it had been authenticated.
fn conn_auth_origin(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut user: Option<String> = None;
    let mut buf = Vec::new();
    loop {
        let Some(head) = next_head(&mut s, &mut buf) else { return user.is_some() };
        let auth = head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("authorization").then(|| v.trim().to_string())
        });
        let token = auth.as_deref().and_then(|a| a.split_once(' ')).map(|(_, t)| t);
        let scheme = auth.as_deref().and_then(|a| a.split(' ').next()).unwrap_or("NTLM");
        if let Some(name) = token.and_then(|t| t.strip_prefix("user=")) {
            user = Some(name.to_string());
        }
        let answer = match (&user, token) {
            (Some(name), _) => {
                let body = format!("private page of {name}");
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len())
            }
            (None, Some("hello")) => format!(
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: {scheme} challenge\r\nContent-Length: 0\r\n\r\n"
            ),
            (None, _) => "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: NTLM\r\nWWW-Authenticate: Negotiate\r\nContent-Length: 0\r\n\r\n".to_string(),
        };
        if s.write_all(answer.as_bytes()).is_err() {
            return user.is_some();
        }
    }
}

/// One GET of `url` on `c`, with an `Authorization` value when given: (status, body).
fn get_on(c: &mut Conn, url: &str, auth: Option<&str>) -> (u16, String) {
    let field = auth.map(|a| format!("Authorization: {a}"));
    let fields: Vec<&str> = field.iter().map(String::as_str).collect();
    c.send(&request("GET", url, &fields, b""));
    let r = c.read_response();
    (r.status, r.text())
}

/// User A authenticates an origin connection with NTLM (or Negotiate) through rustle;
/// user B, on another client connection, must never be served on it: B gets the
/// origin's 401 while A's connection lives and after it ended, A's later requests go on
/// A's authenticated connection, and that connection closes when A's does.
#[test]
fn a_connection_authenticated_origin_connection_stays_with_its_client() {
    for scheme in ["NTLM", "Negotiate"] {
        let origin = ConnAuthOrigin::start();
        let proxy = Proxy::start();
        let url = format!("http://{}/private", origin.addr);
        let mut a = Conn::open(proxy.addr());
        let hello = format!("{scheme} hello");
        assert_eq!(get_on(&mut a, &url, Some(&hello)).0, 401, "{scheme}: the challenge");
        let alice = format!("{scheme} user=alice");
        let page = (200, "private page of alice".to_string());
        assert_eq!(get_on(&mut a, &url, Some(&alice)), page, "{scheme}: A authenticated");
        // B, while A's connection is open and idle.
        let mut b = Conn::open(proxy.addr());
        assert_eq!(get_on(&mut b, &url, None).0, 401, "{scheme}: B got A's connection");
        // A goes on on its own connection, without credentials.
        assert_eq!(get_on(&mut a, &url, None), page, "{scheme}: A's next request");
        drop(a);
        // A's origin connection ends with A's.
        let ended = wait_until(Duration::from_secs(5), || origin.ended() == 1);
        assert!(ended, "{scheme}: A's origin connection outlived A");
        assert_eq!(get_on(&mut b, &url, None).0, 401, "{scheme}: B after A left");
        let mut c = Conn::open(proxy.addr());
        assert_eq!(get_on(&mut c, &url, None).0, 401, "{scheme}: a third client");
    }
}

/// The same over HTTP/2: the streams of A's connection share its pinned origin
/// connection, B's streams never get it.
#[tokio::test]
async fn an_http2_connection_authenticated_origin_connection_stays_with_its_client() {
    let origin = ConnAuthOrigin::start();
    let proxy = Proxy::from_toml("[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n");
    let url = format!("http://{}/private", origin.addr);
    async fn h2(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        send
    }
    async fn get2(
        c: &mut h2::client::SendRequest<bytes::Bytes>,
        url: &str,
        auth: Option<&str>,
    ) -> (u16, String) {
        let mut req = http::Request::get(url);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let mut c = c.clone().ready().await.unwrap();
        let (resp, _) = c.send_request(req.body(()).unwrap(), true).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), resp).await.unwrap().unwrap();
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut text = Vec::new();
        while let Some(chunk) = body.data().await {
            text.extend_from_slice(&chunk.unwrap());
        }
        (status, String::from_utf8(text).unwrap())
    }
    let mut a = h2(proxy.addr()).await;
    assert_eq!(get2(&mut a, &url, Some("NTLM hello")).await.0, 401);
    let page = (200, "private page of alice".to_string());
    assert_eq!(get2(&mut a, &url, Some("NTLM user=alice")).await, page);
    let mut b = h2(proxy.addr()).await;
    assert_eq!(get2(&mut b, &url, None).await.0, 401, "B got A's origin connection");
    assert_eq!(get2(&mut a, &url, None).await, page, "A's next stream");
    drop(a);
    let ended = wait_until_async(Duration::from_secs(5), || origin.ended() == 1).await;
    assert!(ended, "A's origin connection outlived A");
    assert_eq!(get2(&mut b, &url, None).await.0, 401, "B after A left");
}
