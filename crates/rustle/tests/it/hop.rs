//! `rustle::upstream::hop` against a real rustle as the parent: a tunnel through its HTTP listener
//! (CONNECT, with and without Basic credentials), its SOCKS listener as a SOCKS5 parent
//! with username/password and as a SOCKS4a parent, each to a `TcpEcho`; and a UDP
//! association through it to a `UdpEcho`.

use std::net::SocketAddr;
use std::time::Duration;

use rustle::upstream::hop::{tunnel, udp_associate, Credentials, HopError, HopKind};
use rustle_bench::{TcpEcho, UdpEcho};
use rustle_proto::socks5;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::util::*;

const T: Duration = Duration::from_secs(5);
const ALICE: Option<Credentials<'static>> = Some(Credentials { user: "alice", password: "secret" });

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// A tunnel through the parent at `proxy` to `host:port`, then bytes both ways through
/// it (the echo sends back what it got).
async fn echo_through(
    proxy: SocketAddr,
    kind: HopKind,
    creds: Option<Credentials<'_>>,
    host: &str,
    port: u16,
) -> Result<(), HopError> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let early = tunnel(&mut s, kind, creds, host, port, T).await?;
    assert!(early.is_empty(), "{kind:?}: the echo sends nothing first: {early:?}");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = s.split();
    let (sent, got) = tokio::join!(async { w.write_all(&data).await }, async {
        let mut got = vec![0u8; data.len()];
        r.read_exact(&mut got).await.map(|_| got)
    });
    sent.unwrap();
    assert!(got.unwrap() == data, "{kind:?}: echoed bytes differ");
    Ok(())
}

/// A SOCKS listener asking for username/password, with alice/secret.
fn socks_auth_proxy() -> Proxy {
    Proxy::from_toml(
        r#"
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
[auth]
failures_burst = 1000
[[auth.user]]
name = "alice"
password = "plain:secret"
"#,
    )
}

#[test]
fn http_connect_through_rustle() {
    let echo = TcpEcho::start().unwrap();
    let port = echo.addr().port();
    let open = Proxy::start();
    let authed = Proxy::from_toml(&auth_http_config(""));
    block_on(async {
        echo_through(open.addr(), HopKind::Http, None, "127.0.0.1", port).await.unwrap();
        echo_through(open.addr(), HopKind::Http, None, "localhost", port).await.unwrap();
        echo_through(authed.addr(), HopKind::Http, ALICE, "127.0.0.1", port).await.unwrap();

        let e = echo_through(authed.addr(), HopKind::Http, None, "127.0.0.1", port).await;
        assert!(matches!(e, Err(HopError::Refused { status: 407 })), "{e:?}");
        let wrong = Some(Credentials { user: "alice", password: "wrong" });
        let e = echo_through(authed.addr(), HopKind::Http, wrong, "127.0.0.1", port).await;
        assert!(matches!(e, Err(HopError::Refused { status: 407 })), "{e:?}");
    });
    assert_eq!(echo.connections(), 3);
    open.log_line(|l| l.contains("CONNECT") && l.contains(&format!("localhost:{port}")));
}

#[test]
fn socks5_with_credentials_through_rustle() {
    let echo = TcpEcho::start().unwrap();
    let port = echo.addr().port();
    let proxy = socks_auth_proxy();
    block_on(async {
        echo_through(proxy.addr(), HopKind::Socks5, ALICE, "127.0.0.1", port).await.unwrap();
        echo_through(proxy.addr(), HopKind::Socks5, ALICE, "localhost", port).await.unwrap();

        let wrong = Some(Credentials { user: "alice", password: "wrong" });
        let e = echo_through(proxy.addr(), HopKind::Socks5, wrong, "127.0.0.1", port).await;
        assert!(matches!(e, Err(HopError::AuthFailed)), "{e:?}");
        let e = echo_through(proxy.addr(), HopKind::Socks5, None, "127.0.0.1", port).await;
        assert!(matches!(e, Err(HopError::NoAcceptableMethod)), "{e:?}");
        // Nothing listens there: the parent's own reply code comes back.
        let closed = closed_port();
        let e = echo_through(proxy.addr(), HopKind::Socks5, ALICE, "127.0.0.1", closed.port())
            .await
            .unwrap_err();
        assert_eq!(e.socks5_reply(), socks5::Reply::ConnectionRefused, "{e}");
    });
    assert_eq!(echo.connections(), 2);
    proxy.log_line(|l| l.contains(" CONNECT socks5://") && l.ends_with(" user=alice"));
}

#[test]
fn socks4a_through_rustle() {
    let echo = TcpEcho::start().unwrap();
    let port = echo.addr().port();
    let proxy = Proxy::socks();
    let user = Some(Credentials { user: "carol", password: "not sent" });
    block_on(async {
        echo_through(proxy.addr(), HopKind::Socks4a, None, "localhost", port).await.unwrap();
        echo_through(proxy.addr(), HopKind::Socks4a, user, "127.0.0.1", port).await.unwrap();
        let closed = closed_port();
        let e =
            echo_through(proxy.addr(), HopKind::Socks4a, None, "127.0.0.1", closed.port()).await;
        assert!(matches!(e, Err(HopError::Socks4Refused { code: 0x5b, .. })), "{e:?}");
    });
    assert_eq!(echo.connections(), 2);
}

#[test]
fn udp_associate_through_rustle() {
    let echo = UdpEcho::start().unwrap();
    let proxy = socks_auth_proxy();
    block_on(async {
        let mut control = TcpStream::connect(proxy.addr()).await.unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let relay =
            udp_associate(&mut control, ALICE, sock.local_addr().unwrap(), T).await.unwrap();
        assert_eq!(relay.ip().to_string(), "127.0.0.1");
        assert_ne!(relay.port(), 0);

        let mut datagram = Vec::new();
        socks5::write_udp_header(echo.addr(), &mut datagram);
        datagram.extend_from_slice(b"through the parent");
        sock.send_to(&datagram, relay).await.unwrap();
        let mut buf = [0u8; 512];
        let (n, from) =
            tokio::time::timeout(T, sock.recv_from(&mut buf)).await.expect("an echo").unwrap();
        assert_eq!(from, relay);
        let (header, at) = socks5::parse_udp(&buf[..n]).unwrap();
        assert_eq!(header.dst, echo.addr().into());
        assert_eq!(&buf[at..n], b"through the parent");
        drop(control);
    });
}
