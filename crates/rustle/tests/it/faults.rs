//! A side that fails in the middle of an exchange: an origin that closes a reused
//! connection without answering (only idempotent requests are sent again), and a client
//! that leaves while the proxy waits for the origin or for a BIND's peer (everything that
//! exists for it ends at once).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request};
use rustle::config::ListenerKind;

use crate::util::socks::*;
use crate::util::*;

/// Reads one request head and its Content-Length body from `r`; `None` at end of stream.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut len = 0usize;
    loop {
        let mut field = String::new();
        if r.read_line(&mut field).ok()? == 0 {
            return None;
        }
        if field == "\r\n" {
            break;
        }
        if let Some((name, value)) = field.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                len = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some(line.trim_end().to_string())
}

/// An origin that answers the first request of each connection and closes the connection
/// on the second without answering it, as an origin does whose keep-alive timeout ran out
/// just as a request came. It records every request line it received.
fn origin_closing_reused() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let record = record.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                let Some(first) = read_request(&mut r) else { return };
                record.lock().unwrap().push(first);
                let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                if let Some(second) = read_request(&mut r) {
                    record.lock().unwrap().push(second);
                }
                // Dropped: closed without an answer.
            });
        }
    });
    (addr, seen)
}

/// An origin that reads requests and never answers; counts the connections it accepted and
/// those whose other end (the proxy) closed.
struct Silent {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

fn silent_origin() -> Silent {
    stalling_origin(b"")
}

/// An origin that answers every connection's first request with `answer` (a response head
/// and the start of its body, say) and then goes silent, reading until the proxy closes.
fn stalling_origin(answer: &'static [u8]) -> Silent {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let (a, c) = (accepted.clone(), closed.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            a.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            std::thread::spawn(move || {
                let mut sink = [0u8; 4096];
                let mut answered = answer.is_empty();
                while matches!(conn.read(&mut sink), Ok(n) if n > 0) {
                    if !answered {
                        answered = conn.write_all(answer).is_ok();
                    }
                }
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Silent { addr, accepted, closed }
}

/// Whether a TCP socket listens on `port` (any address), from /proc/net/tcp and tcp6.
fn listening(port: u16) -> bool {
    let local = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).unwrap_or_default().lines().skip(1).any(|row| {
            let cols: Vec<&str> = row.split_whitespace().collect();
            // local_address is column 1, st column 3 (0A: LISTEN).
            cols.len() > 3 && format!("{} ", cols[1]).ends_with(&local) && cols[3] == "0A"
        })
    })
}

/// Waits until `counter` reaches `n`, for at most `within`; the time it took, if it did.
fn reaches(counter: &AtomicUsize, n: usize, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    wait_until(within, || counter.load(Ordering::SeqCst) >= n).then(|| start.elapsed())
}

#[test]
fn a_post_on_a_reused_connection_that_dies_is_not_sent_twice() {
    let (origin, seen) = origin_closing_reused();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    c.send(format!("GET http://{origin}/first HTTP/1.1\r\nHost: {origin}\r\n\r\n").as_bytes());
    assert_eq!(c.read_response().status, 200);
    c.send(
        format!(
            "POST http://{origin}/order HTTP/1.1\r\nHost: {origin}\r\nContent-Length: 5\r\n\r\nhello"
        )
        .as_bytes(),
    );
    let resp = c.read_response();
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert!(resp.text().contains("not idempotent"), "{}", resp.text());
    let posts = seen.lock().unwrap().iter().filter(|l| l.starts_with("POST")).count();
    assert_eq!(posts, 1, "the origin received the POST {posts} times: {:?}", seen.lock().unwrap());
    proxy.log_line(|l| l.contains(" 502 ") && l.contains("not idempotent"));
}

#[test]
fn a_get_on_a_reused_connection_that_dies_is_sent_again() {
    let (origin, seen) = origin_closing_reused();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    for path in ["/first", "/second"] {
        c.send(format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\n\r\n").as_bytes());
        assert_eq!(c.read_response().status, 200, "{path}");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.iter().filter(|l| l.starts_with("GET /second")).count(), 2, "{seen:?}");
}

#[tokio::test]
async fn an_http2_post_on_a_reused_connection_that_dies_is_not_sent_twice() {
    let (origin, seen) = origin_closing_reused();
    let proxy = Proxy::start_with(|cfg| cfg.listeners[0].h2c = true);
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let mut status = |method: Method, path: &str| {
        let req = Request::builder().method(method).uri(format!("http://{origin}{path}"));
        let (resp, _) = send.send_request(req.body(()).unwrap(), true).expect("send");
        async move { resp.await.expect("response").status().as_u16() }
    };
    assert_eq!(status(Method::GET, "/first").await, 200);
    // The pooled connection is reused for a POST without a body, and dies under it.
    assert_eq!(status(Method::POST, "/order").await, 502);
    let posts = seen.lock().unwrap().iter().filter(|l| l.starts_with("POST")).count();
    assert_eq!(posts, 1, "the origin received the POST {posts} times");
}

#[test]
fn a_client_that_leaves_before_the_answer_closes_its_origin_connection_at_once() {
    let origin = silent_origin();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    let o = origin.addr;
    c.send(format!("GET http://{o}/slow HTTP/1.1\r\nHost: {o}\r\n\r\n").as_bytes());
    assert!(reaches(&origin.accepted, 1, Duration::from_secs(5)).is_some(), "no origin conn");
    // The scenario: the client leaves after the proxy has waited a while for the answer
    // (past the tick after which it watches the client), not at once.
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    let took = reaches(&origin.closed, 1, Duration::from_secs(5));
    assert!(took.is_some(), "the origin connection outlived its client by 5 s");
    let line = proxy.log_line(|l| l.contains("/slow"));
    assert!(line.contains("client closed the connection while waiting"), "{line}");
}

#[test]
fn a_client_that_leaves_after_a_request_body_closes_its_origin_connection() {
    let origin = silent_origin();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    let o = origin.addr;
    // A body too large to go out with the head: it is streamed, then the wait begins.
    let body = vec![b'x'; 256 * 1024];
    c.send(
        format!(
            "POST http://{o}/slow HTTP/1.1\r\nHost: {o}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    c.send(&body);
    assert!(reaches(&origin.accepted, 1, Duration::from_secs(5)).is_some(), "no origin conn");
    // The scenario, as above: the client leaves once the wait for the answer is under way.
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    let took = reaches(&origin.closed, 1, Duration::from_secs(5));
    assert!(took.is_some(), "the origin connection outlived its client by 5 s");
}

#[test]
fn a_pipelined_request_sent_while_the_origin_thinks_is_kept_for_its_turn() {
    let origin = rustle_bench::Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    let slow = origin.url("/delay/400");
    let fast = origin.url("/bytes/3");
    let host = origin.addr();
    c.send(format!("GET {slow} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    // Sent while the proxy waits for the first answer (and watches this client): once the
    // origin has the first request, which it answers 400 ms later.
    assert!(wait_until(Duration::from_secs(5), || origin.requests() > 0), "no request");
    c.send(format!("GET {fast} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    assert_eq!(c.read_response().status, 200);
    let second = c.read_response();
    assert_eq!((second.status, second.body.len()), (200, 3));
}

#[tokio::test]
async fn http2_streams_of_a_client_that_leaves_close_their_origin_connections() {
    let origin = silent_origin();
    let proxy = Proxy::start_with(|cfg| cfg.listeners[0].h2c = true);
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let driver = tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let mut pending = Vec::new();
    for i in 0..20 {
        let req = Request::get(format!("http://{}/slow/{i}", origin.addr)).body(()).unwrap();
        let (resp, _) = send.send_request(req, true).expect("send");
        pending.push(resp);
        send = send.ready().await.unwrap();
    }
    let accepted = origin.accepted.clone();
    let all_in =
        tokio::task::spawn_blocking(move || reaches(&accepted, 20, Duration::from_secs(5)));
    assert!(all_in.await.unwrap().is_some(), "the origin saw {:?}", origin.accepted);
    // One stream reset by the client: its origin connection ends, the others stay.
    drop(pending.remove(0));
    let closed = origin.closed.clone();
    let one = tokio::task::spawn_blocking(move || reaches(&closed, 1, Duration::from_secs(5)));
    assert!(one.await.unwrap().is_some(), "a reset stream kept its origin connection");
    // That the others stay is seen only over time: a short real wait in which a wrong
    // close (which would fail the test) would show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.closed.load(Ordering::SeqCst), 1, "other streams' origin connections ended");
    // The whole connection goes: every origin connection ends with it.
    driver.abort();
    drop(send);
    drop(pending);
    let closed = origin.closed.clone();
    let all = tokio::task::spawn_blocking(move || reaches(&closed, 20, Duration::from_secs(5)));
    assert!(all.await.unwrap().is_some(), "{:?} of 20 origin connections closed", origin.closed);
}

#[test]
fn a_socks5_bind_whose_client_leaves_stops_listening() {
    let proxy = Proxy::with_listener(ListenerKind::Socks, None, |_| {});
    let (s, rep, bound) = open5(proxy.addr(), BIND, &Dst::Addr("127.0.0.1:0".parse().unwrap()));
    assert_eq!(rep, 0, "first BIND reply");
    assert!(listening(bound.port()), "nothing listens on {bound}");
    drop(s);
    // Looked up in the kernel's table: a connection would be taken as the BIND's peer.
    let gone = wait_until(Duration::from_secs(5), || !listening(bound.port()));
    assert!(gone, "{bound} still listens 5 s after");
    let line = proxy.log_line(|l| l.contains(" BIND "));
    assert!(line.contains("client closed the connection while waiting for the BIND"), "{line}");
}

/// A proxy whose upstream connections may take 8 s, so that an attempt that outlives its
/// client is told from one that ends with it.
fn slow_connect_proxy(kind: ListenerKind, target: Option<SocketAddr>) -> Proxy {
    Proxy::with_listener(kind, target, |c| {
        c.timeouts.connect = Duration::from_secs(8);
        c.listeners[0].h2c = kind == ListenerKind::Http;
    })
}

/// Opens a connection, sends `bytes`, leaves after 300 ms, and expects the log line of
/// the connection (`pred`) to say the client left while connecting, within 2 s.
/// `reply` bytes are read first (an unread answer would make the close a reset).
fn leaves_while_connecting(proxy: &Proxy, bytes: &[u8], reply: usize, pred: impl Fn(&str) -> bool) {
    let mut c = connect(proxy.addr());
    c.write_all(bytes).unwrap();
    read_exact_n(&mut c, reply);
    // The scenario: the client leaves while the proxy connects (to a black hole, for 8 s),
    // once that is under way.
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    let left = Instant::now();
    let line = proxy.log_line(pred);
    assert!(line.contains("client closed the connection while connecting"), "{line}");
    assert!(left.elapsed() < Duration::from_secs(3), "logged {:?} after", left.elapsed());
}

#[test]
fn a_connect_whose_client_leaves_stops_connecting() {
    let hole = black_hole();
    let proxy = slow_connect_proxy(ListenerKind::Http, None);
    let a = hole.addr;
    let req = format!("CONNECT {a} HTTP/1.1\r\nHost: {a}\r\n\r\n");
    leaves_while_connecting(&proxy, req.as_bytes(), 0, |l| l.contains(" CONNECT "));
}

#[test]
fn a_forwarded_request_whose_client_leaves_stops_connecting() {
    let hole = black_hole();
    let proxy = slow_connect_proxy(ListenerKind::Http, None);
    let a = hole.addr;
    let req = format!("GET http://{a}/never HTTP/1.1\r\nHost: {a}\r\n\r\n");
    leaves_while_connecting(&proxy, req.as_bytes(), 0, |l| l.contains("/never"));
    // https:// too (the connect comes before the TLS handshake).
    let req = format!("GET https://{a}/never-tls HTTP/1.1\r\nHost: {a}\r\n\r\n");
    leaves_while_connecting(&proxy, req.as_bytes(), 0, |l| l.contains("/never-tls"));
}

#[test]
fn a_socks_connect_whose_client_leaves_stops_connecting() {
    let hole = black_hole();
    let proxy = slow_connect_proxy(ListenerKind::Socks, None);
    let mut hello = vec![5, 1, 0];
    hello.extend_from_slice(&request5(CONNECT, &Dst::Addr(hole.addr)));
    leaves_while_connecting(&proxy, &hello, 2, |l| l.contains("socks5://"));
    let SocketAddr::V4(v4) = hole.addr else { unreachable!("black_hole is IPv4") };
    let hello = request4(CONNECT, v4, "me", None);
    leaves_while_connecting(&proxy, &hello, 0, |l| l.contains("socks4://"));
}

#[test]
fn a_relay_whose_client_leaves_stops_connecting() {
    let hole = black_hole();
    let proxy = slow_connect_proxy(ListenerKind::Relay, Some(hole.addr));
    leaves_while_connecting(&proxy, b"", 0, |l| l.contains("RELAY"));
}

#[tokio::test]
async fn an_http2_connect_stream_reset_while_connecting_stops_connecting() {
    let hole = black_hole();
    let proxy = slow_connect_proxy(ListenerKind::Http, None);
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = Request::builder().method(Method::CONNECT).uri(hole.addr.to_string());
    let (resp, stream) = send.send_request(req.body(()).unwrap(), false).expect("send");
    // The scenario, as in `leaves_while_connecting`.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Dropping both halves resets the stream.
    drop((resp, stream));
    let left = Instant::now();
    let line = tokio::task::spawn_blocking(move || {
        let line = proxy.log_line(|l| l.contains(" CONNECT "));
        drop(proxy);
        line
    });
    let line = line.await.unwrap();
    assert!(line.contains("client closed the connection while connecting"), "{line}");
    assert!(left.elapsed() < Duration::from_secs(3), "logged {:?} after", left.elapsed());
}

/// A listener whose accept queue is full until `after`, then accepts one connection and
/// echoes it: a connection to it is made only when its SYN is sent again (about 1 s
/// later), long enough for the client to send bytes while the proxy connects.
fn slow_echo(after: Duration) -> SocketAddr {
    let BlackHole { addr, listener, held } = black_hole();
    let l: TcpListener = listener.into();
    std::thread::spawn(move || {
        // The scenario: a listener that cannot take connections for a while.
        std::thread::sleep(after);
        // The queue's own connections go, which lets the proxy's SYN in when it comes again.
        for _ in 0..held.len() {
            let _ = l.accept();
        }
        drop(held);
        let Ok((mut conn, _)) = l.accept() else { return };
        let mut buf = [0u8; 4096];
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 || conn.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    });
    addr
}

#[test]
fn bytes_and_a_half_close_sent_during_a_slow_connect_go_through_once_in_order() {
    let origin = slow_echo(Duration::from_millis(100));
    let proxy = slow_connect_proxy(ListenerKind::Http, None);
    let mut c = connect(proxy.addr());
    let head = format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n");
    c.write_all(format!("{head}first,").as_bytes()).unwrap();
    // Sent while the proxy connects (and watches this client): the scenario is a client
    // writing in pieces, 0.4 s and 0.7 s in, of a connect that takes about a second.
    std::thread::sleep(Duration::from_millis(400));
    c.write_all(b"second,").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.write_all(b"third").unwrap();
    // Then its sending side ends, still during the connect: that is no leaving, and the
    // end goes through the tunnel after the bytes.
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let got = read_exact_n(&mut c, established.len() + 18);
    assert_eq!(got[..established.len()], established[..], "{}", String::from_utf8_lossy(&got));
    assert_eq!(&got[established.len()..], b"first,second,third");
    assert_eq!(read_to_eof(&mut c), b"", "bytes after the echo");

    // SOCKS5 optimistic data, the same way.
    let origin = slow_echo(Duration::from_millis(100));
    let proxy = slow_connect_proxy(ListenerKind::Socks, None);
    let mut c = connect(proxy.addr());
    let mut hello = vec![5, 1, 0];
    hello.extend_from_slice(&request5(CONNECT, &Dst::Addr(origin)));
    hello.extend_from_slice(b"first,");
    c.write_all(&hello).unwrap();
    // The same pieces, as above.
    std::thread::sleep(Duration::from_millis(400));
    c.write_all(b"second,").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.write_all(b"third").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_exact_n(&mut c, 2), [5, 0]);
    let reply = read_exact_n(&mut c, 10);
    assert_eq!(reply[1], 0, "{reply:?}");
    assert_eq!(read_exact_n(&mut c, 18), b"first,second,third");
    assert_eq!(read_to_eof(&mut c), b"", "bytes after the echo");

    // The port relay.
    let origin = slow_echo(Duration::from_millis(100));
    let proxy = slow_connect_proxy(ListenerKind::Relay, Some(origin));
    let mut c = connect(proxy.addr());
    c.write_all(b"first,").unwrap();
    // The same pieces, as above.
    std::thread::sleep(Duration::from_millis(400));
    c.write_all(b"second,").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.write_all(b"third").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_exact_n(&mut c, 18), b"first,second,third");
    assert_eq!(read_to_eof(&mut c), b"", "bytes after the echo");
}

#[test]
fn an_https_request_whose_client_leaves_during_the_origin_handshake_stops_it() {
    // The origin accepts and never answers the ClientHello.
    let origin = silent_origin();
    let proxy = Proxy::start_with(|c| c.timeouts.handshake = Duration::from_secs(8));
    let o = origin.addr;
    let req = format!("GET https://{o}/handshake HTTP/1.1\r\nHost: {o}\r\n\r\n");
    leaves_while_connecting(&proxy, req.as_bytes(), 0, |l| l.contains("/handshake"));
    assert!(reaches(&origin.closed, 1, Duration::from_secs(2)).is_some(), "origin still open");
}

#[tokio::test]
async fn http2_streams_whose_origin_stalls_mid_body_end_with_their_client() {
    let origin = stalling_origin(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nfirst bytes");
    let proxy = Proxy::start_with(|cfg| cfg.listeners[0].h2c = true);
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let driver = tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let mut bodies = Vec::new();
    for i in 0..10 {
        let req = Request::get(format!("http://{}/stream/{i}", origin.addr)).body(()).unwrap();
        let (resp, _) = send.send_request(req, true).expect("send");
        let resp = tokio::time::timeout(Duration::from_secs(5), resp).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let first = tokio::time::timeout(Duration::from_secs(5), body.data()).await.unwrap();
        assert_eq!(first.unwrap().unwrap().as_ref(), b"first bytes");
        bodies.push(body);
        send = send.ready().await.unwrap();
    }
    // Every answer is under way and its origin silent: the client goes.
    driver.abort();
    drop((send, bodies));
    let closed = origin.closed.clone();
    let all = tokio::task::spawn_blocking(move || reaches(&closed, 10, Duration::from_secs(5)));
    assert!(all.await.unwrap().is_some(), "{:?} of 10 origin connections closed", origin.closed);
}

#[test]
fn a_half_closed_client_still_gets_a_prompt_answer() {
    // Ending the sending side after the request counts as leaving only once the origin
    // has taken a tick (as squid and nginx take it); a prompt answer still arrives.
    let origin = rustle_bench::Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    let url = origin.url("/bytes/3");
    c.send(format!("GET {url} HTTP/1.1\r\nHost: {}\r\n\r\n", origin.addr()).as_bytes());
    c.shutdown_write();
    let resp = c.read_response();
    assert_eq!((resp.status, resp.body.len()), (200, 3));
}

#[test]
fn a_client_that_leaves_while_its_answer_stalls_closes_its_origin_connection() {
    // The answer's head and first bytes come, then the origin goes silent (a stream, a
    // long poll): the client's end ends the exchange, kept-alive connection or new one.
    for keep in [false, true] {
        let origin =
            stalling_origin(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nfirst bytes");
        let proxy = Proxy::start();
        let mut c = Conn::to_proxy(&proxy);
        let o = origin.addr;
        if keep {
            // A first exchange registers the connection with the event loop.
            let fast = rustle_bench::Origin::start().unwrap();
            c.send(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", fast.url("/bytes/3")).as_bytes());
            assert_eq!(c.read_response().status, 200);
        }
        c.send(format!("GET http://{o}/stream HTTP/1.1\r\nHost: {o}\r\n\r\n").as_bytes());
        let head = c.read_head();
        assert_eq!(head.status, 200);
        assert_eq!(c.take(11), b"first bytes");
        drop(c);
        let took = reaches(&origin.closed, 1, Duration::from_secs(5));
        assert!(took.is_some(), "the origin connection outlived its client by 5 s (keep {keep})");
        let line = proxy.log_line(|l| l.contains("/stream"));
        assert!(line.contains("client closed the connection while waiting"), "{line}");
    }
}
