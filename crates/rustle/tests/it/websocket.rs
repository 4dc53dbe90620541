//! Upgrades: a WebSocket session relayed after 101, and upgrade requests the origin
//! declines.

use rustle_bench::pattern::pattern;
use rustle_bench::ws::accept_key;
use rustle_bench::{Origin, TlsOrigin};

use crate::util::*;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;

/// One masked client frame (RFC 6455 5.2).
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
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

/// Reads one server frame: (fin, opcode, payload). Server frames are unmasked.
fn read_frame(c: &mut Conn) -> (bool, u8, Vec<u8>) {
    let h = c.take(2);
    assert_eq!(h[1] & 0x80, 0, "server frames must not be masked");
    let len = match h[1] & 0x7f {
        126 => u16::from_be_bytes(c.take(2).try_into().unwrap()) as usize,
        127 => u64::from_be_bytes(c.take(8).try_into().unwrap()) as usize,
        n => n as usize,
    };
    (h[0] & 0x80 != 0, h[0] & 0x0f, c.take(len))
}

fn upgrade_request(url: &str) -> Vec<u8> {
    request(
        "GET",
        url,
        &[
            "Upgrade: websocket",
            "Connection: Upgrade",
            &format!("Sec-WebSocket-Key: {KEY}"),
            "Sec-WebSocket-Version: 13",
        ],
        b"",
    )
}

#[test]
fn websocket_echo_through_the_proxy() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    c.send(&upgrade_request(&origin.url("/ws")));
    let r = c.read_head();
    assert_eq!(r.status, 101, "{}", r.head_text());
    assert_eq!(r.header("sec-websocket-accept"), Some(accept_key(KEY.as_bytes()).as_str()));
    assert!(r.header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")));
    assert!(r.header("connection").is_some_and(|v| v.to_ascii_lowercase().contains("upgrade")));

    let big = pattern(70 * 1024);
    let messages: Vec<(u8, Vec<u8>)> = vec![
        (TEXT, b"hello".to_vec()),
        (BINARY, vec![0, 1, 2, 255, 13, 10]),
        (BINARY, big),
        (TEXT, "d\u{e9}j\u{e0} vu".as_bytes().to_vec()),
    ];
    // The first one alone, the rest in one write.
    c.send(&client_frame(messages[0].0, &messages[0].1));
    let (fin, op, payload) = read_frame(&mut c);
    assert!(fin);
    assert_eq!((op, payload.as_slice()), (TEXT, &b"hello"[..]));
    let batch: Vec<u8> = messages[1..].iter().flat_map(|(op, p)| client_frame(*op, p)).collect();
    c.send(&batch);
    for (op, p) in &messages[1..] {
        let (fin, got_op, got) = read_frame(&mut c);
        assert!(fin);
        assert_eq!(got_op, *op);
        assert_eq!(got.len(), p.len());
        assert!(got == *p, "echoed payload of {} bytes differs", p.len());
    }
    // Close handshake: the server echoes our close, then the connection ends.
    let close_payload = 1000u16.to_be_bytes();
    c.send(&client_frame(CLOSE, &close_payload));
    let (_, op, payload) = read_frame(&mut c);
    assert_eq!(op, CLOSE);
    assert_eq!(payload, close_payload);
    c.assert_closed();
    assert_eq!(origin.ws_messages(), 4);
}

#[test]
fn declined_upgrade_stays_http() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start();
    let mut c = Conn::to_proxy(&proxy);
    c.send(&upgrade_request(&origin.url("/bytes/10")));
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_eq!(r.body, pattern(10));
    c.send(&upgrade_request(&origin.url("/status/200")));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "status 200\n");
    // Still plain HTTP on the same connection.
    c.send(&get(&origin.url("/bytes/20")));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, pattern(20));
    assert_eq!(origin.requests(), 3);
}

/// aiohttp, among others, asks an HTTP proxy for `GET ws://host/path` (or `wss://`) with
/// the upgrade: ws:// is taken as http://, and wss:// as https:// (TLS originated by the
/// proxy). Without an upgrade, such a target gets a 400 that says why.
#[test]
fn ws_and_wss_targets_are_upgraded() {
    let origin = Origin::start().unwrap();
    let tls_origin = TlsOrigin::start().unwrap();
    let toml = format!("[tls]\norigin_ca = \"{}\"\n", tls_origin.ca_file().display());
    let proxy = Proxy::from_toml(&toml);
    let ws = origin.url("/ws").replacen("http://", "ws://", 1);
    let wss = tls_origin.url("/ws").replacen("https://", "wss://", 1);
    for url in [&ws, &wss] {
        let mut c = Conn::to_proxy(&proxy);
        c.send(&upgrade_request(url));
        let r = c.read_head();
        assert_eq!(r.status, 101, "{url}: {}", r.head_text());
        assert_eq!(r.header("sec-websocket-accept"), Some(accept_key(KEY.as_bytes()).as_str()));
        c.send(&client_frame(TEXT, b"through the proxy"));
        let (fin, op, payload) = read_frame(&mut c);
        assert!(fin);
        assert_eq!((op, payload.as_slice()), (TEXT, &b"through the proxy"[..]), "{url}");
    }
    assert_eq!(origin.ws_messages(), 1);
    assert_eq!(tls_origin.ws_messages(), 1);
    for url in [&ws, &wss] {
        let resp = parse_response(&raw(&proxy, &get(url)));
        assert_eq!(resp.status, 400, "{url}");
        assert!(resp.text().contains("websocket upgrade"), "{url}: {}", resp.text());
    }
}
