//! TLS: the HTTPS proxy port (curl `--proxy https://`, TLS in TLS for CONNECT), TLS on
//! `auto` ports, client certificates, SNI, TLS-terminating and -originating relays
//! (openssl s_client, verification failures named), resumption, certificate reload on
//! SIGHUP, `rustle check` on bad certificates, the handshake timeout and bad input.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustle::io::tls::write_self_signed;
use rustle_bench::{Origin, TcpEcho, TlsOrigin};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::util::*;

mod close;
mod resume;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A rustls client trusting the CA in `ca`, optionally presenting a client certificate.
fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain: Vec<_> =
                CertificateDer::pem_file_iter(cert).unwrap().map(|c| c.unwrap()).collect();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    Arc::new(config)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to `addr` asking for `name`; the handshake is completed (or fails)
/// before this returns.
fn tls_connect(
    addr: SocketAddr,
    name: &str,
    config: &Arc<rustls::ClientConfig>,
) -> std::io::Result<Tls> {
    let sock = connect(addr);
    let name = ServerName::try_from(name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// Sends one request over `tls` and reads one response.
fn exchange(tls: &mut Tls, request: &[u8]) -> Resp {
    tls.write_all(request).unwrap();
    tls.flush().unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = tls.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before a whole response: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let resp = parse_head(&got[..end + 4]);
        let len: usize = resp.header("content-length").map_or(0, |v| v.parse().unwrap());
        if got.len() >= end + 4 + len {
            return parse_response(&got);
        }
    }
}

fn certs(dir: &TempDir, name: &str) -> rustle::io::tls::SelfSignedFiles {
    write_self_signed(name, &dir.path().join(name)).expect("self-signed set")
}

fn https_toml(files: &rustle::io::tls::SelfSignedFiles, extra: &str) -> String {
    format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\n{extra}\n[listener.tls]\n\
         cert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    )
}

fn proxy_url(proxy: &Proxy) -> String {
    format!("https://localhost:{}", proxy.addr().port())
}

#[test]
fn curl_through_the_https_port_for_http_and_tls_in_tls_connect() {
    let dir = TempDir::new("https");
    let files = certs(&dir, "localhost");
    let proxy = Proxy::from_toml(&https_toml(&files, ""));
    let origin = Origin::start().unwrap();
    let tls_origin = TlsOrigin::start().unwrap();
    let ca = files.ca.to_str().unwrap();
    let url = origin.url("/bytes/100000");
    let Some(out) = curl(&["--proxy", &proxy_url(&proxy), "--proxy-cacert", ca, &url]) else {
        return;
    };
    assert_success("curl --proxy https:// http://", &out);
    assert_eq!(out.stdout.len(), 100_000);
    // CONNECT inside TLS, then the origin's own TLS inside that: TLS in TLS.
    let origin_ca = tls_origin.ca_file();
    let url = tls_origin.url("/bytes/300000");
    let out = curl(&[
        "--proxy",
        &proxy_url(&proxy),
        "--proxy-cacert",
        ca,
        "--cacert",
        origin_ca.to_str().unwrap(),
        &url,
    ])
    .unwrap();
    assert_success("curl --proxy https:// https://", &out);
    assert_eq!(out.stdout.len(), 300_000);
    let line = proxy.log_line(|l| l.contains("CONNECT"));
    assert!(line.contains(" 200 "), "{line}");
    assert!(line.contains("tls=TLSv1_3/"), "{line}");
    assert!(line.contains("sni=localhost"), "{line}");
    let line = proxy.log_line(|l| l.contains("GET http://"));
    assert!(line.contains("tls=TLSv1_3/"), "{line}");
}

#[test]
fn keep_alive_requests_over_one_tls_connection_and_a_post_body() {
    let dir = TempDir::new("https-ka");
    let files = certs(&dir, "localhost");
    let proxy = Proxy::from_toml(&https_toml(&files, ""));
    let origin = Origin::start().unwrap();
    let config = client_config(&files.ca, None);
    let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
    for i in 0..5 {
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\n\r\n",
            origin.url(&format!("/bytes/{}", 1000 + i)),
            origin.addr()
        );
        let resp = exchange(&mut tls, req.as_bytes());
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.len(), 1000 + i);
    }
    let body = vec![b'x'; 200_000];
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
        origin.url("/echo"),
        origin.addr(),
        body.len()
    );
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(&body);
    let resp = exchange(&mut tls, &bytes);
    assert_eq!(resp.status, 200);
    assert_eq!(sha256_hex(&resp.body), sha256_hex(&body));
}

#[test]
fn plain_http_on_the_tls_port_gets_a_400_that_says_so() {
    let dir = TempDir::new("https-plain");
    let files = certs(&dir, "localhost");
    let proxy = Proxy::from_toml(&https_toml(&files, ""));
    let got = raw(&proxy, b"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\n\r\n");
    let resp = parse_response(&got);
    assert_eq!(resp.status, 400);
    assert!(resp.text().contains("expects TLS"), "{}", resp.text());
    // Garbage is closed at once, without an answer.
    let mut s = connect(proxy.addr());
    s.write_all(b"\x00\x01\x02garbage").unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)));
    let line = proxy.log_line(|l| l.contains("not a TLS handshake"));
    assert!(line.contains("127.0.0.1"), "{line}");
}

#[test]
fn a_stalled_handshake_is_cut_off() {
    let dir = TempDir::new("https-stall");
    let files = certs(&dir, "localhost");
    let toml = format!("[timeouts]\nhandshake = \"300ms\"\n{}", https_toml(&files, ""));
    let proxy = Proxy::from_toml(&toml);
    let mut s = connect(proxy.addr());
    // The start of a ClientHello record, and then nothing.
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)), "still open after the timeout");
    let line = proxy.log_line(|l| l.contains("timed out"));
    assert!(line.contains("TLS handshake timed out"), "{line}");
}

#[test]
fn authentication_and_rules_apply_on_the_https_port() {
    let dir = TempDir::new("https-auth");
    let files = certs(&dir, "localhost");
    let extra = "auth = true";
    let toml = format!(
        "{}[[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n\
         [[rule]]\nname = \"no-origin-port-1\"\naction = \"deny\"\nports = [\"1\"]\n",
        https_toml(&files, extra)
    );
    let proxy = Proxy::from_toml(&toml);
    let origin = Origin::start().unwrap();
    let ca = files.ca.to_str().unwrap();
    let url = origin.url("/bytes/10");
    let Some(out) = curl(&[
        "--proxy",
        &proxy_url(&proxy),
        "--proxy-cacert",
        ca,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &url,
    ]) else {
        return;
    };
    assert_eq!(String::from_utf8_lossy(&out.stdout), "407");
    let out = curl(&[
        "--proxy",
        &proxy_url(&proxy),
        "--proxy-cacert",
        ca,
        "--proxy-user",
        "alice:secret",
        &url,
    ])
    .unwrap();
    assert_success("curl with credentials", &out);
    assert_eq!(out.stdout.len(), 10);
    let out = curl(&[
        "--proxy",
        &proxy_url(&proxy),
        "--proxy-cacert",
        ca,
        "--proxy-user",
        "alice:secret",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://127.0.0.1:1/",
    ])
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");
}

/// A CA and a client certificate signed by it, with `cn` as the subject's common name.
fn client_identity(dir: &TempDir, cn: &str) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "test client CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let (ca_path, cert_path, key_path) =
        (dir.file("client-ca.pem"), dir.file("client.pem"), dir.file("client.key"));
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (ca_path, cert_path, key_path)
}

#[test]
fn client_certificates_are_verified_and_name_the_user_for_rules() {
    let dir = TempDir::new("https-mtls");
    let files = certs(&dir, "localhost");
    let (client_ca, cert, key) = client_identity(&dir, "alice");
    let toml = format!(
        "default_action = \"deny\"\n{}client_ca = \"{}\"\nclient_certs = \"required\"\n\
         [[auth.user]]\nname = \"alice\"\npassword = \"plain:unused\"\n\
         [[rule]]\nname = \"alice-only\"\naction = \"allow\"\nusers = [\"alice\"]\n",
        https_toml(&files, "auth = true"),
        client_ca.display()
    );
    let proxy = Proxy::from_toml(&toml);
    let origin = Origin::start().unwrap();
    let with_cert = client_config(&files.ca, Some((&cert, &key)));
    let mut tls = tls_connect(proxy.addr(), "localhost", &with_cert).unwrap();
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/7"));
    let resp = exchange(&mut tls, req.as_bytes());
    assert_eq!(resp.status, 200, "{}", resp.text());
    let line = proxy.log_line(|l| l.contains("/bytes/7"));
    assert!(line.contains("user=alice"), "{line}");
    // Without a certificate the handshake fails (TLS 1.3 reports it on the first read).
    let without = client_config(&files.ca, None);
    let refused = match tls_connect(proxy.addr(), "localhost", &without) {
        Err(_) => true,
        Ok(mut tls) => {
            let _ = tls.write_all(req.as_bytes());
            let _ = tls.flush();
            let mut b = [0u8; 1];
            !matches!(tls.read(&mut b), Ok(1))
        }
    };
    assert!(refused, "a client without a certificate was served");
}

#[test]
fn a_user_disabled_or_removed_by_the_api_is_refused_with_its_certificate_too() {
    let dir = TempDir::new("https-mtls-disabled");
    let files = certs(&dir, "localhost");
    let (client_ca, cert, key) = client_identity(&dir, "alice");
    let token = "api-token-0123456789abcdef0123456789";
    let toml = format!(
        "{}client_ca = \"{}\"\nclient_certs = \"required\"\n\
         [[auth.user]]\nname = \"alice\"\npassword = \"plain:unused\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\napi_token = \"{token}\"\n",
        https_toml(&files, "auth = true"),
        client_ca.display()
    );
    let proxy = Proxy::from_toml(&toml);
    let mut s = connect(proxy.admin_addr());
    let req = format!(
        "POST /api/v1/users/alice/disable HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let (bytes, _) = read_until_close(&mut s);
    assert_eq!(parse_response(&bytes).status, 200, "{}", String::from_utf8_lossy(&bytes));
    let origin = Origin::start().unwrap();
    let with_cert = client_config(&files.ca, Some((&cert, &key)));
    let mut tls = tls_connect(proxy.addr(), "localhost", &with_cert).unwrap();
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/7"));
    let resp = exchange(&mut tls, req.as_bytes());
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("user disabled"), "{}", resp.text());
    // Removed, the refusal says so.
    let mut s = connect(proxy.admin_addr());
    let req = format!(
        "DELETE /api/v1/users/alice HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let (bytes, _) = read_until_close(&mut s);
    assert_eq!(parse_response(&bytes).status, 200, "{}", String::from_utf8_lossy(&bytes));
    let mut tls = tls_connect(proxy.addr(), "localhost", &with_cert).unwrap();
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/7"));
    let resp = exchange(&mut tls, req.as_bytes());
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("user removed"), "{}", resp.text());
}

/// A name only a client certificate gives (no user of the file has it) is disabled
/// through the API: refused with its certificate, and served again once enabled.
#[test]
fn a_certificate_only_user_can_be_disabled_by_the_api() {
    let dir = TempDir::new("https-mtls-cert-only");
    let files = certs(&dir, "localhost");
    let (client_ca, cert, key) = client_identity(&dir, "carol");
    let token = "api-token-0123456789abcdef0123456789";
    let toml = format!(
        "{}client_ca = \"{}\"\nclient_certs = \"required\"\n\
         [[auth.user]]\nname = \"alice\"\npassword = \"plain:unused\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\napi_token = \"{token}\"\n",
        https_toml(&files, "auth = true"),
        client_ca.display()
    );
    let proxy = Proxy::from_toml(&toml);
    let admin = |what: &str| {
        let mut s = connect(proxy.admin_addr());
        let req = format!(
            "POST /api/v1/users/carol/{what} HTTP/1.1\r\nHost: a\r\n\
             Authorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n"
        );
        s.write_all(req.as_bytes()).unwrap();
        let (bytes, _) = read_until_close(&mut s);
        assert_eq!(parse_response(&bytes).status, 200, "{}", String::from_utf8_lossy(&bytes));
    };
    let origin = Origin::start().unwrap();
    let with_cert = client_config(&files.ca, Some((&cert, &key)));
    let get = || {
        let mut tls = tls_connect(proxy.addr(), "localhost", &with_cert).unwrap();
        let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/7"));
        exchange(&mut tls, req.as_bytes())
    };
    assert_eq!(get().status, 200);
    admin("disable");
    let resp = get();
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("user disabled"), "{}", resp.text());
    admin("enable");
    assert_eq!(get().status, 200);
}

#[test]
fn certificates_are_chosen_by_sni_and_unknown_names_can_be_refused() {
    let dir = TempDir::new("https-sni");
    let a = certs(&dir, "a.test");
    let b = certs(&dir, "b.test");
    let toml = format!(
        "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\n[listener.tls]\n\
         cert = \"{}\"\nkey = \"{}\"\nunknown_sni = \"refuse\"\n\
         [[listener.tls.sni]]\nnames = \"b.test, *.b.test\"\ncert = \"{}\"\nkey = \"{}\"\n",
        a.chain.display(),
        a.key.display(),
        b.chain.display(),
        b.key.display()
    );
    let proxy = Proxy::from_toml(&toml);
    tls_connect(proxy.addr(), "a.test", &client_config(&a.ca, None)).expect("a.test");
    tls_connect(proxy.addr(), "b.test", &client_config(&b.ca, None)).expect("b.test");
    // b.test's certificate does not cover www.b.test; the configured wildcard picks it,
    // and the client's verification (not the proxy) then refuses the name.
    let e = tls_connect(proxy.addr(), "www.b.test", &client_config(&b.ca, None)).unwrap_err();
    assert!(e.to_string().contains("not valid for name"), "{e}");
    let e = tls_connect(proxy.addr(), "other.test", &client_config(&a.ca, None)).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("alert"), "{e}");
}

#[test]
fn the_auto_port_recognises_a_client_hello() {
    let dir = TempDir::new("auto-tls");
    let files = certs(&dir, "localhost");
    let toml = format!(
        "[[listener]]\nkind = \"auto\"\nlisten = \"127.0.0.1:0\"\n[listener.tls]\n\
         cert = \"{}\"\nkey = \"{}\"\n",
        files.chain.display(),
        files.key.display()
    );
    let proxy = Proxy::from_toml(&toml);
    let origin = Origin::start().unwrap();
    let url = origin.url("/bytes/1234");
    let ca = files.ca.to_str().unwrap();
    let Some(out) = curl(&["--proxy", &proxy_url(&proxy), "--proxy-cacert", ca, &url]) else {
        return;
    };
    assert_success("TLS on the auto port", &out);
    assert_eq!(out.stdout.len(), 1234);
    let plain = format!("http://{}", proxy.addr());
    let out = curl(&["--proxy", &plain, &url]).unwrap();
    assert_success("plain HTTP on the auto port", &out);
    let socks = format!("socks5h://{}", proxy.addr());
    let out = curl(&["--proxy", &socks, &url]).unwrap();
    assert_success("SOCKS5 on the auto port", &out);
}

#[test]
fn a_terminating_relay_serves_openssl_s_client() {
    let dir = TempDir::new("relay-term");
    let files = certs(&dir, "localhost");
    let echo = TcpEcho::start().unwrap();
    let toml = format!(
        "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{}\"\n\
         [listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        echo.addr(),
        files.chain.display(),
        files.key.display()
    );
    let proxy = Proxy::from_toml(&toml);
    // A rustls client: bytes echoed through the terminating relay, then a clean close.
    let config = client_config(&files.ca, None);
    let mut tls = tls_connect(proxy.addr(), "localhost", &config).unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    tls.write_all(&payload).unwrap();
    tls.flush().unwrap();
    let mut got = vec![0u8; payload.len()];
    tls.read_exact(&mut got).unwrap();
    assert_eq!(got, payload);
    drop(tls);
    if !have("openssl") {
        return;
    }
    let mut child = clean_command("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-connect"])
        .arg(proxy.addr().to_string())
        .args(["-servername", "localhost", "-CAfile"])
        .arg(&files.ca)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run openssl");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hello through s_client\n").unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut line = [0u8; 23];
    stdout.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"hello through s_client\n");
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    let line = proxy.log_line(|l| l.contains("RELAY") && l.contains("tls="));
    assert!(line.contains("sni=localhost"), "{line}");
}

fn originating_relay(origin: &TlsOrigin, tls: &str) -> Proxy {
    let toml = format!(
        "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:0\"\ntarget = \"{}\"\n\
         [listener.target_tls]\n{tls}\n",
        origin.addr()
    );
    Proxy::from_toml(&toml)
}

fn plain_get(proxy: &Proxy, path: &str) -> Vec<u8> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    raw(proxy, req.as_bytes())
}

#[test]
fn an_originating_relay_verifies_the_target_and_resumes_sessions() {
    let origin = TlsOrigin::start().unwrap();
    let ca = format!("ca = \"{}\"", origin.ca_file().display());
    let proxy = originating_relay(&origin, &ca);
    for _ in 0..3 {
        let resp = parse_response(&plain_get(&proxy, "/bytes/5000"));
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.len(), 5000);
    }
    // The relay's client config keeps sessions: later connections resume.
    assert!(origin.resumed() >= 1, "no resumed handshake in {}", origin.connections());
    // Even a burst of connections opening at once: every handshake leaves tickets behind,
    // and the store keeps enough of them for the next burst.
    let burst = |n: usize| {
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let addr = proxy.addr();
                std::thread::spawn(move || {
                    let req = b"GET /bytes/10 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
                    parse_response(&raw_to(addr, req)).status
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 200);
        }
    };
    burst(24);
    let before = origin.resumed();
    burst(24);
    let resumed = origin.resumed() - before;
    assert!(resumed >= 20, "only {resumed} of 24 connections opened together resumed");
    // A configured server name is what is verified (and sent).
    let named = originating_relay(&origin, &format!("{ca}\nserver_name = \"localhost\""));
    assert_eq!(parse_response(&plain_get(&named, "/bytes/1")).status, 200);
}

#[test]
fn an_originating_relay_names_what_verification_found() {
    let cases: [(&str, TlsOrigin, &str); 3] = [
        ("wrong CA", TlsOrigin::start().unwrap(), "UnknownIssuer"),
        (
            "wrong name",
            TlsOrigin::start_with(&["other.test"], false).unwrap(),
            "not valid for name",
        ),
        ("expired", TlsOrigin::start_with(&["127.0.0.1"], true).unwrap(), "certificate expired"),
    ];
    let unrelated = TlsOrigin::start().unwrap();
    for (what, origin, named) in &cases {
        let ca = match *what {
            "wrong CA" => unrelated.ca_file(),
            _ => origin.ca_file(),
        };
        let proxy = originating_relay(origin, &format!("ca = \"{}\"", ca.display()));
        let got = plain_get(&proxy, "/bytes/1");
        assert!(got.is_empty(), "{what}: bytes came back: {:?}", String::from_utf8_lossy(&got));
        let line = proxy.log_line(|l| l.contains("TLS to ") && l.contains(" failed: "));
        assert!(line.contains(named), "{what}: {line}");
        assert_eq!(origin.requests(), 0, "{what}: the origin was reached");
    }
    // `insecure` accepts what verification refused.
    let origin = &cases[1].1;
    let proxy = originating_relay(origin, "insecure = true\nserver_name = \"localhost\"");
    assert_eq!(parse_response(&plain_get(&proxy, "/bytes/3")).status, 200);
}

#[test]
fn https_port_sessions_resume() {
    let dir = TempDir::new("https-resume");
    let files = certs(&dir, "localhost");
    let proxy = Proxy::from_toml(&https_toml(&files, ""));
    let config = client_config(&files.ca, None);
    let mut first = tls_connect(proxy.addr(), "localhost", &config).unwrap();
    // TLS 1.3 tickets arrive after the handshake: read once so the client has them.
    let origin = Origin::start().unwrap();
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/1"));
    assert_eq!(exchange(&mut first, req.as_bytes()).status, 200);
    let second = tls_connect(proxy.addr(), "localhost", &config).unwrap();
    assert_eq!(second.conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
}

#[test]
fn sighup_reloads_certificates_and_keeps_open_connections() {
    let dir = TempDir::new("https-reload");
    let old = certs(&dir, "localhost");
    let new_dir = TempDir::new("https-reload-new");
    let new = certs(&new_dir, "localhost");
    let proxy = Proxy::from_toml(&https_toml(&old, ""));
    let origin = Origin::start().unwrap();
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/2"));
    let mut open = tls_connect(proxy.addr(), "localhost", &client_config(&old.ca, None)).unwrap();
    assert_eq!(exchange(&mut open, req.as_bytes()).status, 200);
    proxy.reload_toml(&https_toml(&new, ""));
    // The connection made before the reload goes on.
    assert_eq!(exchange(&mut open, req.as_bytes()).status, 200);
    // New connections get the new certificate: the old CA no longer verifies it.
    let mut fresh = tls_connect(proxy.addr(), "localhost", &client_config(&new.ca, None)).unwrap();
    assert_eq!(exchange(&mut fresh, req.as_bytes()).status, 200);
    let e = tls_connect(proxy.addr(), "localhost", &client_config(&old.ca, None)).unwrap_err();
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
}

/// Certificates follow their listener's address, not its position: a reload that puts
/// the listeners in another order and changes one listener's certificate gives each
/// listener its own.
#[test]
fn a_reload_keeps_certificates_with_their_listeners_when_reordered() {
    let dir = TempDir::new("https-reorder");
    let (a, b, c) = (certs(&dir, "a.test"), certs(&dir, "b.test"), certs(&dir, "c.test"));
    let https = |ip: &str, files: &rustle::io::tls::SelfSignedFiles| {
        format!(
            "[[listener]]\nkind = \"https\"\nlisten = \"{ip}:0\"\n[listener.tls]\n\
             cert = \"{}\"\nkey = \"{}\"\n",
            files.chain.display(),
            files.key.display()
        )
    };
    let proxy = Proxy::from_toml(&format!("{}{}", https("127.0.0.1", &a), https("127.0.0.2", &b)));
    let (one, two) = (proxy.addr_of(0), proxy.addr_of(1));
    let verifies = |addr, name: &str, files: &rustle::io::tls::SelfSignedFiles| {
        tls_connect(addr, name, &client_config(&files.ca, None)).is_ok()
    };
    assert!(verifies(one, "a.test", &a) && verifies(two, "b.test", &b));
    // 127.0.0.2 first now, with the same certificate; 127.0.0.1 gets c.
    proxy.reload_toml(&format!("{}{}", https("127.0.0.2", &b), https("127.0.0.1", &c)));
    assert!(verifies(one, "c.test", &c), "127.0.0.1 does not present its new certificate");
    assert!(!verifies(one, "b.test", &b), "127.0.0.1 took the other listener's certificate");
    assert!(verifies(two, "b.test", &b), "127.0.0.2 lost its certificate");
}

#[test]
fn check_reports_certificate_problems() {
    let dir = TempDir::new("check-tls");
    let a = certs(&dir, "a.test");
    let b = certs(&dir, "b.test");
    let cases = [
        (dir.file("missing.pem"), a.key.clone(), "cannot read"),
        (a.chain.clone(), b.key.clone(), "does not match"),
        (a.key.clone(), a.key.clone(), "no certificate"),
    ];
    for (cert, key, expect) in cases {
        let toml = format!(
            "[[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\n[listener.tls]\n\
             cert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        );
        let path = dir.file("rustle.toml");
        std::fs::write(&path, toml).unwrap();
        let out = clean_command(rustle_bin())
            .arg("check")
            .arg("--config")
            .arg(&path)
            .output()
            .expect("run rustle check");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{expect}: {err}");
        assert!(err.contains(expect), "{expect}: {err}");
    }
}

fn https_origin_proxy(ca: &Path) -> Proxy {
    Proxy::from_toml(&format!("[tls]\norigin_ca = \"{}\"\n", ca.display()))
}

#[test]
fn https_urls_in_absolute_form_are_fetched_over_tls_and_pooled() {
    let origin = TlsOrigin::start().unwrap();
    let proxy = https_origin_proxy(&origin.ca_file());
    let mut conn = Conn::to_proxy(&proxy);
    for n in [100, 200_000, 5] {
        let url = origin.url(&format!("/bytes/{n}"));
        conn.send(format!("GET {url} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        let resp = conn.read_response();
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.body.len(), n);
    }
    assert_eq!(origin.connections(), 1, "the TLS origin connection was not reused");
    let line = proxy.log_line(|l| l.contains("/bytes/5"));
    assert!(line.contains("GET https://"), "{line}");
}

#[test]
fn a_bad_origin_certificate_gets_a_502_naming_the_verification_error() {
    let unrelated = TlsOrigin::start().unwrap();
    let cases = [
        ("wrong CA", TlsOrigin::start().unwrap(), "UnknownIssuer", true),
        (
            "wrong name",
            TlsOrigin::start_with(&["other.test"], false).unwrap(),
            "not valid for name",
            false,
        ),
        (
            "expired",
            TlsOrigin::start_with(&["127.0.0.1"], true).unwrap(),
            "certificate expired",
            false,
        ),
    ];
    for (what, origin, named, other_ca) in &cases {
        let ca = if *other_ca { unrelated.ca_file() } else { origin.ca_file() };
        let proxy = https_origin_proxy(&ca);
        let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/1"));
        let resp = parse_response(&raw(&proxy, req.as_bytes()));
        assert_eq!(resp.status, 502, "{what}");
        assert!(resp.text().contains(named), "{what}: {}", resp.text());
        assert!(resp.text().contains("TLS to "), "{what}: {}", resp.text());
        assert_eq!(origin.requests(), 0, "{what}");
    }
}

#[test]
fn kernel_tls_is_probed_and_user_space_tls_serves_where_it_is_missing() {
    let dir = TempDir::new("ktls");
    let files = certs(&dir, "localhost");
    let (cert, key) = (files.chain.to_str().unwrap(), files.key.to_str().unwrap());
    let args = ["--https", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--workers", "1"];
    let bin = crate::lifecycle::Binary::start_with(&args, "https");
    let origin = Origin::start().unwrap();
    let config = client_config(&files.ca, None);
    let mut tls = tls_connect(bin.addr, "localhost", &config).unwrap();
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/64"));
    let resp = exchange(&mut tls, req.as_bytes());
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body.len(), 64);
    let said = bin.stderr();
    // One line either way: this machine's kernel lacks the module (user space serves);
    // a kernel that has it gets the session handed over.
    let missing = said.matches("kernel TLS is not available").count();
    let present = said.matches("kernel TLS is available").count();
    assert_eq!(missing + present, 1, "{said}");
    // `ktls = "off"` does not probe at all.
    let toml = format!("[tls]\nktls = \"off\"\n{}", https_toml(&files, ""));
    let path = dir.file("off.toml");
    std::fs::write(&path, toml).unwrap();
    let off = crate::lifecycle::Binary::start_with(&["--config", path.to_str().unwrap()], "https");
    let mut tls = tls_connect(off.addr, "localhost", &config).unwrap();
    assert_eq!(exchange(&mut tls, req.as_bytes()).status, 200);
    assert!(!off.stderr().contains("kernel TLS"), "{}", off.stderr());
}

#[test]
fn tls_1_2_clients_are_served_too() {
    let dir = TempDir::new("tls12");
    let files = certs(&dir, "localhost");
    let proxy = Proxy::from_toml(&https_toml(&files, ""));
    let origin = Origin::start().unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&files.ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tls = tls_connect(proxy.addr(), "localhost", &Arc::new(config)).unwrap();
    assert_eq!(tls.conn.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/bytes/9"));
    assert_eq!(exchange(&mut tls, req.as_bytes()).status, 200);
    let line = proxy.log_line(|l| l.contains("/bytes/9"));
    assert!(line.contains("tls=TLSv1_2/"), "{line}");
}
