//! Plain forward proxying of http:// requests.

use std::time::Duration;

use rustle_bench::pattern::{pattern, pattern_sha256_hex};
use rustle_bench::Origin;

use crate::util::*;

/// curl fetches `path` through the proxy into a file; returns (status, body).
fn curl_get(proxy: &Proxy, url: &str) -> Option<(String, Vec<u8>)> {
    let dir = TempDir::new("curl");
    let file = dir.file("body");
    let out = curl(&["-x", &proxy.url(), "-o", file.to_str()?, "-w", "%{http_code}", url])?;
    assert_success("curl", &out);
    let body = std::fs::read(&file).unwrap_or_default();
    Some((String::from_utf8_lossy(&out.stdout).into_owned(), body))
}

#[test]
fn curl_get_small_and_large_bodies_intact() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    for n in [1024u64, 5 * 1024 * 1024] {
        let Some((status, body)) = curl_get(&proxy, &origin.url(&format!("/bytes/{n}"))) else {
            return;
        };
        assert_eq!(status, "200");
        assert_eq!(body.len() as u64, n);
        assert_eq!(sha256_hex(&body), pattern_sha256_hex(n), "body of /bytes/{n} corrupted");
    }
}

#[test]
fn curl_reuses_one_client_connection_for_two_urls() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let (a, b) = (origin.url("/bytes/100"), origin.url("/bytes/200"));
    let Some(out) = curl(&[
        "-x",
        &proxy.url(),
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{num_connects}\n",
        &a,
        &b,
    ]) else {
        return;
    };
    assert_success("curl", &out);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, ["200 1", "200 0"], "second URL should reuse the proxy connection");
    assert_eq!(origin.connections(), 1, "the origin saw more than one connection");
    assert_eq!(origin.requests(), 2);
}

#[test]
fn separate_client_connections_share_one_pooled_origin_connection() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    for i in 0..3 {
        let Some((status, body)) = curl_get(&proxy, &origin.url("/bytes/1000")) else {
            return;
        };
        assert_eq!(status, "200", "request {i}");
        assert_eq!(sha256_hex(&body), pattern_sha256_hex(1000));
    }
    assert_eq!(origin.requests(), 3);
    assert_eq!(origin.connections(), 1, "the pooled origin connection was not reused");
}

/// Writes 10 MB of pattern bytes to a file for uploads.
fn upload_file(dir: &TempDir, n: usize) -> String {
    let path = dir.file("upload");
    std::fs::write(&path, pattern(n)).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn curl_uploads_10mb_with_length_and_chunked() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let dir = TempDir::new("upload");
    let n = 10 * 1024 * 1024;
    let file = upload_file(&dir, n);
    let expected = format!("{} {n}", pattern_sha256_hex(n as u64));
    let data = format!("@{file}");
    let url = origin.url("/sha256");
    let Some(out) = curl(&["-x", &proxy.url(), "--data-binary", &data, &url]) else {
        return;
    };
    assert_success("curl POST", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "Content-Length upload");
    let proxy_url = proxy.url();
    let args = ["-x", &proxy_url, "-H", "Transfer-Encoding: chunked", "--data-binary", &data, &url];
    let out = curl(&args).unwrap();
    assert_success("curl chunked POST", &out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "chunked upload");
    let head = String::from_utf8_lossy(&origin.last_request_head()).to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "origin saw: {head}");
}

#[test]
fn chunked_and_close_delimited_downloads_intact() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let n = 1_000_003u64;
    for path in
        [format!("/chunked/{n}"), format!("/chunked/{n}?size=100000"), format!("/close/{n}")]
    {
        let Some((status, body)) = curl_get(&proxy, &origin.url(&path)) else {
            return;
        };
        assert_eq!(status, "200", "{path}");
        assert_eq!(body.len() as u64, n, "{path}");
        assert_eq!(sha256_hex(&body), pattern_sha256_hex(n), "{path}");
    }
}

#[test]
fn chunked_response_keeps_its_framing_and_trailer_on_the_wire() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    c.send(&get(&origin.url("/chunked/10000?size=3000")));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"), "{}", r.head_text());
    assert_eq!(r.body, pattern(10000));
    // Keep-alive after a chunked body: the next response parses cleanly.
    c.send(&get(&origin.url("/bytes/7")));
    assert_eq!(c.read_response().body, pattern(7));
}

#[test]
fn expect_100_continue_is_forwarded_before_the_body() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let body = b"hello, continue";
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request(
        "POST",
        &origin.url("/echo"),
        &["Expect: 100-continue", &format!("Content-Length: {}", body.len())],
        b"",
    ));
    // Nothing of the body has been sent: the 100 must come first.
    c.s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let interim = c.read_head();
    assert_eq!(interim.status, 100, "expected 100 Continue, got {}", interim.head_text());
    assert!(interim.head_text().starts_with("HTTP/1.1 100 Continue\r\n"));
    c.send(body);
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, body);
    // The connection is still usable afterwards.
    c.send(&get(&origin.url("/bytes/3")));
    assert_eq!(c.read_response().body, pattern(3));
}

#[test]
fn curl_large_upload_does_not_wait_for_its_expect_timeout() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let dir = TempDir::new("expect");
    let n = 2 * 1024 * 1024;
    let data = format!("@{}", upload_file(&dir, n));
    // A long expect timeout: if the proxy swallowed the 100, curl would sit out all 5 s.
    let Some(out) = curl(&[
        "-v",
        "--expect100-timeout",
        "5",
        "-x",
        &proxy.url(),
        "--data-binary",
        &data,
        "-w",
        "\n%{time_total}",
        &origin.url("/sha256"),
    ]) else {
        return;
    };
    assert_success("curl", &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (answer, time) = stdout.rsplit_once('\n').unwrap();
    assert_eq!(answer, format!("{} {n}", pattern_sha256_hex(n as u64)));
    assert!(stderr.contains("Expect: 100-continue"), "curl did not send Expect: {stderr}");
    assert!(stderr.contains("< HTTP/1.1 100 Continue"), "no 100 Continue reached curl: {stderr}");
    let secs: f64 = time.trim().parse().unwrap();
    assert!(secs < 4.0, "upload took {secs} s: curl waited for its expect timeout");
}

#[test]
fn head_204_and_304_keep_the_connection_in_sync() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    if let Some(out) = curl(&["-I", "-x", &proxy.url(), &origin.url("/bytes/1234")]) {
        assert_success("curl -I", &out);
        let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 200"), "{text}");
        assert!(text.contains("content-length: 1234"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "HEAD response carried a body: {text:?}");
    }
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request("HEAD", &origin.url("/bytes/1234"), &[], b""));
    let r = c.read_response_to(true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("1234"));
    for code in [204, 304] {
        c.send(&get(&origin.url(&format!("/status/{code}"))));
        let r = c.read_response();
        assert_eq!(r.status, code);
        assert!(r.body.is_empty());
    }
    c.send(&get(&origin.url("/bytes/10")));
    let r = c.read_response();
    assert_eq!(r.status, 200, "the connection lost sync after HEAD/204/304");
    assert_eq!(r.body, pattern(10));
    assert!(c.buf.is_empty(), "stray bytes: {:?}", c.buf);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    let mut batch = get(&origin.url("/bytes/10"));
    batch.extend(get(&origin.url("/chunked/5000?size=1000")));
    batch.extend(request("POST", &origin.url("/echo"), &[], b"third body"));
    batch.extend(get(&origin.url("/bytes/70000")));
    c.send(&batch);
    assert_eq!(c.read_response().body, pattern(10));
    assert_eq!(c.read_response().body, pattern(5000));
    let third = c.read_response();
    assert_eq!(third.status, 200);
    assert_eq!(third.body, b"third body");
    assert_eq!(c.read_response().body, pattern(70000));
    assert_eq!(origin.requests(), 4);
}

#[test]
fn hop_by_hop_fields_are_removed_and_host_rewritten() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let target = origin.url("/headers");
    let req = format!(
        "GET {target} HTTP/1.1\r\n\
         Host: evil.example\r\n\
         Connection: close, X-Private\r\n\
         X-Private: secret\r\n\
         Keep-Alive: 5\r\n\
         Proxy-Connection: keep-alive\r\n\
         Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
         TE: trailers\r\n\
         Trailer: X\r\n\
         Upgrade: foo\r\n\
         X-Keep: 1\r\n\
         \r\n"
    );
    let r = parse_response(&raw(&proxy, req.as_bytes()));
    assert_eq!(r.status, 200);
    let seen = r.text();
    let lines: Vec<&str> = seen.split("\r\n").collect();
    assert_eq!(lines[0], "GET /headers HTTP/1.1", "request line not in origin form: {seen}");
    let names: Vec<String> = lines[1..]
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| l.split(':').next().unwrap().trim().to_ascii_lowercase())
        .collect();
    for gone in [
        "x-private",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    ] {
        assert!(!names.iter().any(|n| n == gone), "`{gone}` reached the origin:\n{seen}");
    }
    assert!(!seen.contains("secret") && !seen.contains("Zm9v"), "private values leaked:\n{seen}");
    assert!(!seen.contains("evil.example"), "client's Host was forwarded:\n{seen}");
    assert!(lines.contains(&format!("Host: {}", origin.addr()).as_str()), "{seen}");
    assert_eq!(names.iter().filter(|n| *n == "host").count(), 1, "{seen}");
    assert!(lines.contains(&"X-Keep: 1"), "end-to-end header dropped:\n{seen}");
    if let Some(conn) = lines.iter().find(|l| l.to_ascii_lowercase().starts_with("connection:")) {
        assert!(!conn.to_ascii_lowercase().contains("x-private"), "{seen}");
    }
}

#[test]
fn via_and_forwarded_headers_only_when_configured() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let r = parse_response(&raw(
        &proxy,
        &request("GET", &origin.url("/headers"), &["Connection: close"], b""),
    ));
    assert_eq!(r.status, 200);
    let seen = r.text().to_ascii_lowercase();
    for name in ["via:", "x-forwarded-for:", "forwarded:"] {
        assert!(!seen.contains(name), "`{name}` added by default:\n{seen}");
    }
    assert!(!r.has_header("via"), "Via on the response by default: {}", r.head_text());

    let proxy = Proxy::start_with(|c| {
        c.http.via = true;
        c.http.forwarded_for = true;
    });
    let r = parse_response(&raw(
        &proxy,
        &request("GET", &origin.url("/headers"), &["Connection: close"], b""),
    ));
    assert_eq!(r.status, 200);
    let seen = r.text();
    let lines: Vec<&str> = seen.split("\r\n").collect();
    assert!(lines.contains(&"Via: 1.1 rustle"), "{seen}");
    assert!(lines.contains(&"X-Forwarded-For: 127.0.0.1"), "{seen}");
    assert!(lines.contains(&"Forwarded: for=127.0.0.1"), "{seen}");
    assert_eq!(r.header("via"), Some("1.1 rustle"), "response Via: {}", r.head_text());

    // Existing values are extended, not replaced (header text only: no traffic goes there).
    let prior = ["Via: 1.0 upstream-proxy", "X-Forwarded-For: 198.51.100.7", "Connection: close"];
    let r = parse_response(&raw(&proxy, &request("GET", &origin.url("/headers"), &prior, b"")));
    let seen = r.text();
    let lines: Vec<&str> = seen.split("\r\n").collect();
    assert!(lines.contains(&"Via: 1.0 upstream-proxy, 1.1 rustle"), "{seen}");
    assert!(lines.contains(&"X-Forwarded-For: 198.51.100.7, 127.0.0.1"), "{seen}");
}

#[test]
fn max_forwards_zero_is_answered_by_the_proxy() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    c.send(&request("OPTIONS", &origin.url("/headers"), &["Max-Forwards: 0"], b""));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    let allow = r.header("allow").unwrap_or_else(|| panic!("no Allow: {}", r.head_text()));
    assert!(allow.contains("GET") && allow.contains("OPTIONS"), "{allow}");

    let trace =
        request("TRACE", &origin.url("/headers"), &["Max-Forwards: 0", "X-Trace: yes"], b"");
    c.send(&trace);
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("message/http"));
    assert_eq!(r.body, trace, "TRACE must echo the request as received");
    assert_eq!(origin.requests(), 0, "the origin was contacted");
    assert_eq!(origin.connections(), 0, "the origin was contacted");

    c.send(&request("OPTIONS", &origin.url("/headers"), &["Max-Forwards: 3"], b""));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    let seen = r.text();
    assert!(seen.split("\r\n").any(|l| l == "Max-Forwards: 2"), "not decremented:\n{seen}");
    assert_eq!(origin.requests(), 1);
}

#[tokio::test]
async fn reqwest_client_through_the_proxy() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    // reqwest as the proxy builds it (rustls with no provider of its own): the process's
    // default provider, aws-lc-rs, as the proxy's.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(proxy.url()).unwrap())
        .build()
        .unwrap();
    let n = 300_000u64;
    let r = client.get(origin.url(&format!("/bytes/{n}"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.bytes().await.unwrap();
    assert_eq!(sha256_hex(&body), pattern_sha256_hex(n));

    let upload = pattern(1_500_000);
    let r = client.post(origin.url("/sha256")).body(upload.clone()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), format!("{} {}", sha256_hex(&upload), upload.len()));

    let r = client.post(origin.url("/echo")).body("round trip").send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "round trip");
    // All went through the proxy (its log) and, being absolute-form, in origin form upstream.
    let head = String::from_utf8_lossy(&origin.last_request_head()).into_owned();
    assert!(head.starts_with("POST /echo HTTP/1.1\r\n"), "{head}");
    wait_until_async(Duration::from_secs(5), || proxy.log_text().lines().count() >= 3).await;
    let lines = proxy.log_lines();
    assert_eq!(lines.len(), 3, "{lines:?}");
}

#[test]
fn wget_through_the_proxy() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    if !have("wget") {
        return;
    }
    let n = 123_457u64;
    let out = clean_command("wget")
        .env("http_proxy", proxy.url())
        .args(["-q", "--tries=1", "--timeout=20", "-O", "-", &origin.url(&format!("/bytes/{n}"))])
        .output()
        .unwrap();
    assert_success("wget", &out);
    assert_eq!(out.stdout.len() as u64, n);
    assert_eq!(sha256_hex(&out.stdout), pattern_sha256_hex(n));
    let line = proxy.log_line(|l| l.contains("/bytes/123457"));
    assert!(line.contains(" 200 "), "{line}");
}

#[test]
fn http10_client_gets_a_dechunked_body() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let n = 10_000;
    let req = format!("GET {} HTTP/1.0\r\n\r\n", origin.url(&format!("/chunked/{n}?size=3000")));
    let r = parse_response(&raw(&proxy, req.as_bytes()));
    assert_eq!(r.status, 200);
    assert!(!r.has_header("transfer-encoding"), "chunked sent to HTTP/1.0: {}", r.head_text());
    assert_eq!(r.body.len(), n, "{}", r.head_text());
    assert!(r.body == pattern(n), "dechunked body differs");
}

/// Whether a chunked request body (ended by a trailer section) is all in.
fn chunked_request_in(b: &[u8]) -> bool {
    b.windows(5).any(|w| w == b"\r\n0\r\n") && b.ends_with(b"\r\n\r\n")
}

/// Identical Content-Length values, listed or repeated, are accepted (RFC 9110 8.6) and
/// reach the origin as one field with one value.
#[test]
fn identical_content_lengths_reach_the_origin_as_one_value() {
    let origin = RawOrigin::start(b"HTTP/1.1 204 No Content\r\n\r\n", |b| b.ends_with(b"hello"));
    let proxy = Proxy::start();
    let a = origin.addr();
    let req = format!(
        "POST http://{a}/ HTTP/1.1\r\nHost: {a}\r\nContent-Length: 5, 5\r\nX: y\r\n\
         Content-Length: 5\r\nConnection: close\r\n\r\nhello"
    );
    let r = parse_response(&raw(&proxy, req.as_bytes()));
    assert_eq!(r.status, 204);
    let seen = String::from_utf8(origin.received()).unwrap();
    assert_eq!(field_lines(&seen, "content-length"), ["Content-Length: 5"], "{seen}");
    assert!(seen.ends_with("\r\n\r\nhello"), "{seen}");
}

/// The same from the origin: the client gets one Content-Length with one value.
#[test]
fn identical_content_lengths_reach_the_client_as_one_value() {
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5,5\r\nContent-Length: 5\r\n\r\nhello";
    for version in ["1.1", "1.0"] {
        let origin = RawOrigin::answering(answer);
        let proxy = Proxy::start();
        let a = origin.addr();
        let req =
            format!("GET http://{a}/ HTTP/{version}\r\nHost: {a}\r\nConnection: close\r\n\r\n");
        let got = String::from_utf8(raw(&proxy, req.as_bytes())).unwrap();
        assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
        assert_eq!(field_lines(&got, "content-length"), ["content-length: 5"], "{got}");
        assert!(got.ends_with("\r\n\r\nhello"), "{got}");
    }
}

/// Fields that RFC 9110 6.5.1 keeps out of trailers do not reach the origin from a
/// chunked request; the others do, and the body is intact.
#[test]
fn forbidden_trailer_fields_do_not_reach_the_origin() {
    let origin = RawOrigin::start(b"HTTP/1.1 204 No Content\r\n\r\n", chunked_request_in);
    let proxy = Proxy::start();
    let a = origin.addr();
    let mut c = Conn::to_proxy(&proxy);
    c.send(
        format!("POST http://{a}/ HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\n\r\n")
            .as_bytes(),
    );
    // The trailer section comes in pieces that cut field names.
    for piece in [
        &b"5\r\nhello\r\n0\r\nX-Sum: 1\r\nConte"[..],
        b"nt-Length: 99\r\nHo",
        b"st: evil.example\r\nAuthorization: Basic eA==\r\nProxy-Authorization: Basic eA==\r\n",
        b"Transfer-Encoding: chunked\r\nX-End: 2\r\n\r\n",
    ] {
        c.send(piece);
        // The scenario: each piece in a read of its own (a pause, not an event to wait for).
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.read_response().status, 204);
    let seen = String::from_utf8(origin.received()).unwrap();
    let body = &seen[seen.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body, "5\r\nhello\r\n0\r\nX-Sum: 1\r\nX-End: 2\r\n\r\n", "{seen}");
}

/// The same from the origin, and to an HTTP/1.0 client (which gets the data only).
#[test]
fn forbidden_trailer_fields_do_not_reach_the_client() {
    let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        5\r\nhello\r\n0\r\nX-Sum: 1\r\nContent-Length: 99\r\nSet-Cookie: a=b\r\n\
        Content-Type: text/evil\r\nTrailer: X\r\nX-End: 2\r\n\r\n";
    let origin = RawOrigin::answering(answer);
    let proxy = Proxy::start();
    let a = origin.addr();
    let req = format!("GET http://{a}/ HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n");
    let got = String::from_utf8(raw(&proxy, req.as_bytes())).unwrap();
    let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body, "5\r\nhello\r\n0\r\nX-Sum: 1\r\nX-End: 2\r\n\r\n", "{got}");

    let origin = RawOrigin::answering(answer);
    let req = format!("GET http://{}/ HTTP/1.0\r\n\r\n", origin.addr());
    let r = parse_response(&raw(&proxy, req.as_bytes()));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello", "{}", r.text());
}
