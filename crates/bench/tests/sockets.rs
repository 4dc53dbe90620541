//! WebSocket, TLS, raw TCP and UDP fixtures.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;

use common::{connect, get, send_all_then_read_to_eof, sha256_hex, Reader};
use rustle_bench::origin::{pattern, pattern_sha256_hex};
use rustle_bench::{Origin, TcpEcho, TcpServe, TlsOrigin, UdpEcho};

/// A masked client frame.
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xffff => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// The unmasked server frame we expect back.
fn server_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(n as u8),
        n if n <= 0xffff => {
            f.push(126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(payload);
    f
}

#[test]
fn websocket_handshake_and_echo() {
    assert_eq!(
        rustle_bench::ws::accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    let o = Origin::start().unwrap();
    let mut r = Reader::new(connect(o.addr()));
    r.s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    assert_eq!(
        r.head(),
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
    );
    let big = pattern(70_000);
    for (op, payload) in [(1u8, &b"hello"[..]), (2, &pattern(300)[..]), (2, &big[..]), (9, b"p")] {
        r.s.write_all(&client_frame(op, payload)).unwrap();
        let want = server_frame(if op == 9 { 0xA } else { op }, payload);
        assert_eq!(r.take(want.len()), want, "opcode {op}");
    }
    assert_eq!(o.ws_messages(), 3);
    r.s.write_all(&client_frame(8, &1000u16.to_be_bytes())).unwrap();
    assert_eq!(r.take(4), server_frame(8, &1000u16.to_be_bytes()));
    assert!(r.read_to_eof().is_empty());

    let resp = get(o.addr(), "/ws");
    assert_eq!(resp.status, 426);
    assert_eq!(resp.header("upgrade"), Some("websocket"));
}

#[test]
fn tcp_echo_half_close() {
    let e = TcpEcho::start().unwrap();
    let data = pattern(500_000);
    // Returns only once the echo half-closes back.
    let got = send_all_then_read_to_eof(e.addr(), &data);
    assert!(got == data);
    assert_eq!(e.connections(), 1);
    assert_eq!(e.bytes_in(), data.len() as u64);
    assert_eq!(e.bytes_out(), data.len() as u64);
}

#[test]
fn tcp_serve_answers_after_half_close() {
    let payload = pattern(200_000);
    let srv = TcpServe::start_with(payload.clone()).unwrap();
    let mut s = connect(srv.addr());
    s.write_all(b"request bytes").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert!(got == payload);
    assert_eq!(srv.bytes_in(), 13);
    assert_eq!(srv.bytes_out(), payload.len() as u64);
    assert_eq!(srv.connections(), 1);
}

#[test]
fn udp_echo() {
    let u = UdpEcho::start().unwrap();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    for msg in [&b"one"[..], &b""[..], &pattern(60_000)[..]] {
        sock.send_to(msg, u.addr()).unwrap();
        let mut buf = vec![0u8; 65536];
        let (n, from) = sock.recv_from(&mut buf).unwrap();
        assert_eq!(from, u.addr());
        assert_eq!(&buf[..n], msg);
    }
    assert_eq!(u.datagrams(), 3);
    assert_eq!(u.bytes(), 60_003);
}

#[tokio::test]
async fn tls_origin_with_rustls_client() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let o = TlsOrigin::start().unwrap();
    assert!(o.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(std::fs::read_to_string(o.ca_file()).unwrap(), o.ca_pem());

    // Build the client config from the PEM alone, as an external client would.
    let mut roots = rustls::RootCertStore::empty();
    let pem = o.ca_pem();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    for (config, name) in
        [(std::sync::Arc::new(config), "localhost"), (o.client_config().unwrap(), "127.0.0.1")]
    {
        let connector = tokio_rustls::TlsConnector::from(config);
        let tcp = tokio::net::TcpStream::connect(o.addr()).await.unwrap();
        let server_name = rustls::pki_types::ServerName::try_from(name).unwrap();
        let mut tls = connector.connect(server_name, tcp).await.unwrap();
        tls.write_all(
            b"GET /bytes/100000 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut raw = Vec::new();
        // The origin sends close_notify before closing; read_to_end ends cleanly.
        tls.read_to_end(&mut raw).await.unwrap();
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n";
        assert!(raw.starts_with(head));
        assert_eq!(sha256_hex(&raw[head.len()..]), pattern_sha256_hex(100_000));
    }
    assert_eq!(o.requests(), 2);
    assert_eq!(o.connections(), 2);
    assert!(o.last_request_head().starts_with(b"GET /bytes/100000"));
    let path = o.ca_file();
    drop(o);
    assert!(!path.exists());
}

#[test]
fn tls_origin_with_curl() {
    if !rustle_bench::tools::need("curl") {
        return;
    }
    let o = TlsOrigin::start().unwrap();
    let ca = o.ca_file();
    for url in [o.url("/bytes/4321"), format!("https://localhost:{}/bytes/4321", o.addr().port())] {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--fail", "--cacert"])
            .arg(&ca)
            .arg(&url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{url}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, pattern(4321));
    }
}

#[test]
fn fixtures_work_from_inside_a_runtime() {
    // Starting and dropping fixtures inside an async context must not panic.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let o = Origin::start().unwrap();
        let addr = o.addr();
        let body = tokio::task::spawn_blocking(move || get(addr, "/bytes/9").body).await.unwrap();
        assert_eq!(body, pattern(9));
        drop(o);
        drop(TlsOrigin::start().unwrap());
    });
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Origin>();
    check::<TlsOrigin>();
    check::<TcpEcho>();
    check::<TcpServe>();
    check::<UdpEcho>();
}
