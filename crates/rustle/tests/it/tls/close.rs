//! Every TLS session rustle ends ends with close_notify, so that a client can tell a
//! complete close-delimited answer from a cut one (GnuTLS clients, git's among them, fail
//! a session that ends without it): the HTTPS and `auto` ports after forwarded answers and
//! idle waits, HTTP/2 over TLS (GOAWAY, then close_notify), CONNECT tunnels inside the
//! HTTPS port, terminating relays.

use super::*;

/// Reads until the session ends: what came, when it ended with close_notify; an error
/// naming what came, when the TCP connection ended without it (rustls says
/// `UnexpectedEof`).
fn read_to_end(tls: &mut Tls) -> Result<Vec<u8>, String> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match tls.read(&mut chunk) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => {
                let start = String::from_utf8_lossy(&got[..got.len().min(40)]).into_owned();
                return Err(format!("{e}, after {} bytes ({start:?}...)", got.len()));
            }
        }
    }
}

fn tls_listener_toml(kind: &str, files: &rustle::io::tls::SelfSignedFiles, extra: &str) -> String {
    format!(
        "{extra}\n[[listener]]\nkind = \"{kind}\"\nlisten = \"127.0.0.1:0\"\n[listener.tls]\n\
         cert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    )
}

#[test]
fn the_https_and_auto_ports_end_every_connection_with_close_notify() {
    let dir = TempDir::new("close-notify");
    let files = certs(&dir, "localhost");
    let origin = Origin::start().unwrap();
    let config = client_config(&files.ca, None);
    let (bytes, close) = (origin.url("/bytes/1000"), origin.url("/close/1000"));
    let cases = [
        (
            "Connection: close",
            format!("GET {bytes} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ),
        ("an HTTP/1.0 client", format!("GET {bytes} HTTP/1.0\r\nHost: x\r\n\r\n")),
        ("a close-delimited body", format!("GET {close} HTTP/1.1\r\nHost: x\r\n\r\n")),
        (
            "a pipelined request, then close",
            format!(
                "GET {bytes} HTTP/1.1\r\nHost: x\r\n\r\n\
                 GET {bytes} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            ),
        ),
        ("the keep-alive timeout", format!("GET {bytes} HTTP/1.1\r\nHost: x\r\n\r\n")),
        ("an error answer", "GET ftp://x/ HTTP/1.1\r\nHost: x\r\n\r\n".to_string()),
    ];
    for kind in ["https", "auto"] {
        let toml = tls_listener_toml(kind, &files, "[timeouts]\nkeepalive = \"300ms\"");
        let proxy = Proxy::from_toml(&toml);
        for (what, request) in &cases {
            let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
            tls.write_all(request.as_bytes()).unwrap();
            tls.flush().unwrap();
            let got = read_to_end(&mut tls)
                .unwrap_or_else(|e| panic!("{kind} port, {what}: no close_notify: {e}"));
            assert!(got.starts_with(b"HTTP/1.1 "), "{kind} port, {what}: {got:?}");
        }
    }
}

#[test]
fn a_connect_tunnel_inside_the_https_port_ends_with_close_notify() {
    let dir = TempDir::new("close-notify-connect");
    let files = certs(&dir, "localhost");
    let config = client_config(&files.ca, None);
    let serve = rustle_bench::TcpServe::start_with(b"served after your end".to_vec()).unwrap();
    let echo = TcpEcho::start().unwrap();
    let toml = tls_listener_toml("https", &files, "[timeouts]\ntunnel_idle = \"500ms\"");
    let proxy = Proxy::from_toml(&toml);
    let open = |target: SocketAddr| {
        let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
        let connect = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        tls.write_all(connect.as_bytes()).unwrap();
        tls.flush().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(tls.read(&mut byte).unwrap(), 1, "closed in the CONNECT answer");
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
        tls
    };
    // The client ends its side (close_notify): the target answers and closes, and that
    // end reaches the client as close_notify.
    let mut tls = open(serve.addr());
    tls.conn.send_close_notify();
    tls.flush().unwrap();
    let got = read_to_end(&mut tls).unwrap_or_else(|e| panic!("target closed: {e}"));
    assert_eq!(got, b"served after your end");
    // An idle tunnel that rustle ends.
    let mut tls = open(echo.addr());
    let got = read_to_end(&mut tls).unwrap_or_else(|e| panic!("idle timeout: {e}"));
    assert_eq!(got, b"");
}

#[test]
fn a_terminating_relay_ends_with_close_notify() {
    let dir = TempDir::new("close-notify-relay");
    let files = certs(&dir, "localhost");
    let config = client_config(&files.ca, None);
    let serve = rustle_bench::TcpServe::start_with(b"relayed".to_vec()).unwrap();
    let echo = TcpEcho::start().unwrap();
    let relay = |target: SocketAddr| {
        let toml = format!(
            "[timeouts]\ntunnel_idle = \"500ms\"\n[[listener]]\nkind = \"relay\"\n\
             listen = \"127.0.0.1:0\"\ntarget = \"{target}\"\n[listener.tls]\n\
             cert = \"{}\"\nkey = \"{}\"\n",
            files.chain.display(),
            files.key.display()
        );
        Proxy::from_toml(&toml)
    };
    let proxy = relay(serve.addr());
    let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
    tls.conn.send_close_notify();
    tls.flush().unwrap();
    let got = read_to_end(&mut tls).unwrap_or_else(|e| panic!("target closed: {e}"));
    assert_eq!(got, b"relayed");
    let proxy = relay(echo.addr());
    let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
    let got = read_to_end(&mut tls).unwrap_or_else(|e| panic!("idle timeout: {e}"));
    assert_eq!(got, b"");
}

/// HTTP/2 over TLS closing an idle connection: GOAWAY, then close_notify.
#[test]
fn http2_over_tls_ends_with_goaway_then_close_notify() {
    let dir = TempDir::new("close-notify-h2");
    let files = certs(&dir, "localhost");
    let mut config = (*client_config(&files.ca, None)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let config = Arc::new(config);
    let toml = tls_listener_toml("https", &files, "[timeouts]\nkeepalive = \"300ms\"");
    let proxy = Proxy::from_toml(&toml);
    let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"h2"[..]));
    let frame = |kind: u8, flags: u8, payload: &[u8]| {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags, 0, 0, 0, 0]);
        f.extend_from_slice(payload);
        f
    };
    let (settings, ping, goaway, ack) = (0x4, 0x6, 0x7, 0x1);
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(settings, 0, &[]));
    tls.write_all(&hello).unwrap();
    tls.flush().unwrap();
    // A client that answers what it is asked (SETTINGS, the PING of a graceful GOAWAY)
    // until the session ends.
    let mut got = Vec::new();
    let mut seen_goaway = false;
    let ended = loop {
        let mut chunk = [0u8; 4096];
        let n = match tls.read(&mut chunk) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(e),
        };
        got.extend_from_slice(&chunk[..n]);
        while got.len() >= 9 {
            let len = u32::from_be_bytes([0, got[0], got[1], got[2]]) as usize;
            if got.len() < 9 + len {
                break;
            }
            let (kind, flags) = (got[3], got[4]);
            let payload = got[9..9 + len].to_vec();
            got.drain(..9 + len);
            seen_goaway |= kind == goaway;
            let answer = match (kind, flags & ack) {
                (k, 0) if k == settings => frame(settings, ack, &[]),
                (k, 0) if k == ping => frame(ping, ack, &payload),
                _ => continue,
            };
            // The proxy may have closed already.
            let _ = tls.write_all(&answer).and_then(|()| tls.flush());
        }
    };
    assert!(seen_goaway, "no GOAWAY before the end");
    ended.unwrap_or_else(|e| panic!("no close_notify after GOAWAY: {e}"));
}

/// A TLS origin for one connection: it answers one request with `answer`, then waits
/// for the proxy to end the session and says how it ended (`Err` without close_notify).
fn tls_origin_once(
    files: &rustle::io::tls::SelfSignedFiles,
    answer: &'static [u8],
) -> (SocketAddr, std::sync::mpsc::Receiver<Result<(), String>>) {
    let chain: Vec<_> =
        CertificateDer::pem_file_iter(&files.chain).unwrap().map(|c| c.unwrap()).collect();
    let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, sock);
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        let ended = loop {
            match tls.read(&mut chunk) {
                Ok(0) => break Ok(()),
                Ok(n) => got.extend_from_slice(&chunk[..n]),
                Err(e) => break Err(e.to_string()),
            }
            if got.ends_with(b"\r\n\r\n") {
                got.clear();
                tls.write_all(answer).and_then(|()| tls.flush()).unwrap();
            }
        };
        let _ = tx.send(ended);
    });
    (addr, rx)
}

/// Sessions rustle originates and ends itself: an idle pooled connection to an https://
/// origin at its idle timeout, one the origin asked to close, and a TLS-originating
/// relay's at the tunnel's idle timeout.
#[test]
fn sessions_rustle_originates_end_with_close_notify() {
    let dir = TempDir::new("close-notify-origin");
    let files = certs(&dir, "localhost");
    let toml = format!(
        "[tls]\norigin_ca = \"{}\"\n[upstream]\npool_idle_timeout = \"300ms\"\n",
        files.ca.display()
    );
    let proxy = Proxy::from_toml(&toml);
    let answers: [(&str, &'static [u8]); 2] = [
        ("pooled, then idle", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        (
            "Connection: close",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        ),
    ];
    for (what, answer) in answers {
        let (origin, ended) = tls_origin_once(&files, answer);
        let url = format!("https://localhost:{}/", origin.port());
        let resp = parse_response(&raw(
            &proxy,
            format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        ));
        assert_eq!(resp.status, 200, "{what}: {}", resp.text());
        let ended = ended.recv_timeout(Duration::from_secs(10)).expect("origin still open");
        ended.unwrap_or_else(|e| panic!("{what}: no close_notify: {e}"));
    }
    // A relay originating TLS, ended by its idle timeout.
    let (origin, ended) =
        tls_origin_once(&files, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let toml = format!(
        "[timeouts]\ntunnel_idle = \"500ms\"\n[[listener]]\nkind = \"relay\"\n\
         listen = \"127.0.0.1:0\"\ntarget = \"localhost:{}\"\n[listener.target_tls]\n\
         ca = \"{}\"\n",
        origin.port(),
        files.ca.display()
    );
    let relay = Proxy::from_toml(&toml);
    let mut conn = Conn::to_proxy(&relay);
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(conn.read_response().status, 200);
    let ended = ended.recv_timeout(Duration::from_secs(10)).expect("origin still open");
    ended.unwrap_or_else(|e| panic!("relay's idle timeout: no close_notify: {e}"));
}
