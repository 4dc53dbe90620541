//! Client addresses per user (`max_client_addresses`, `client_address_ttl`) as clients see
//! them: from two loopback addresses (127.0.0.1 and 127.0.0.2 both reach `lo` on Linux),
//! on HTTP/1, SOCKS5 and SOCKS4; a group's and a user's own limit; and from two network
//! namespaces joined to the proxy's by veth pairs.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustle_bench::{Origin, TcpEcho};

use crate::util::socks::*;
use crate::util::*;

const CONFIG: &str = r#"
[[listener]]
listen = "127.0.0.1:0"
auth = true
[[listener]]
kind = "socks"
listen = "127.0.0.1:0"
auth = true
socks4_users = true
[limits]
max_client_addresses = 1
client_address_ttl = "1s"
[auth]
failures_burst = 1000
[auth.group_limits.pairs]
max_client_addresses = 2
[[auth.user]]
name = "alice"
password = "plain:secret"
[[auth.user]]
name = "bob"
password = "plain:hunter2"
groups = ["pairs"]
[[auth.user]]
name = "carol"
password = "plain:carol-pw"
groups = ["pairs"]
max_client_addresses = 1
"#;

/// How long a closed address stays in use in `CONFIG`.
const TTL: Duration = Duration::from_secs(1);

/// One GET of `url` through `proxy` as `user` from `from`, on a new connection.
fn get_from(from: &str, proxy: std::net::SocketAddr, url: &str, user: &str, pw: &str) -> Resp {
    let mut c = Conn::open_from(from, proxy);
    c.send(&request("GET", url, &[&proxy_auth(user, pw)], b""));
    c.read_response()
}

/// A SOCKS5 CONNECT to `dst` as `user` from `from`: the login's status and the reply.
fn socks5_from(from: &str, proxy: std::net::SocketAddr, user: &str, dst: &Dst<'_>) -> (u8, u8) {
    let mut s = connect_from(from, proxy);
    let login = login5(&mut s, user, "secret");
    if login != 0 {
        return (login, 0xff);
    }
    s.write_all(&request5(CONNECT, dst)).expect("write request");
    (login, read_reply5(&mut s).0)
}

/// A SOCKS4 CONNECT to `dst` as `user` from `from`: the reply code.
fn socks4_from(from: &str, proxy: std::net::SocketAddr, user: &str, dst: &Dst<'_>) -> u8 {
    let Dst::Addr(addr) = dst else { unreachable!("an address") };
    let mut s = connect_from(from, proxy);
    s.write_all(&request4(1, v4(*addr), user, None)).expect("write request");
    read_reply4(&mut s).0
}

#[test]
fn a_second_client_address_is_refused_until_the_first_is_idle_for_the_ttl() {
    let origin = Origin::start().unwrap();
    let echo = TcpEcho::start().unwrap();
    let proxy = Proxy::from_toml(CONFIG);
    let (http, socks) = (proxy.addr(), proxy.addr_of(1));
    let url = origin.url("/bytes/3");
    let alice = proxy_auth("alice", "secret");
    let dst = Dst::Addr(echo.addr());

    let mut held = Conn::open_from("127.0.0.1", http);
    held.send(&request("GET", &url, &[&alice], b""));
    assert_eq!(held.read_response().status, 200);

    // From a second address: refused on every protocol, with the cause.
    let r = get_from("127.0.0.2", http, &url, "alice", "secret");
    assert_eq!(r.status, 403, "{}", r.head_text());
    assert_eq!(r.text().trim(), "user alice is already using 1 client addresses (limit 1)");
    assert_eq!(socks5_from("127.0.0.2", socks, "alice", &dst), (0, 2), "SOCKS5: 0x02 after login");
    assert_eq!(socks4_from("127.0.0.2", socks, "alice", &dst), 0x5b, "SOCKS4: rejected");
    let line = proxy.log_line(|l| l.contains("already using") && l.contains("127.0.0.2"));
    assert!(line.contains("alice"), "{line}");

    // The address in use takes more connections; other users are not affected.
    assert_eq!(get_from("127.0.0.1", http, &url, "alice", "secret").status, 200);
    assert_eq!(socks5_from("127.0.0.1", socks, "alice", &dst), (0, 0));
    assert_eq!(get_from("127.0.0.2", http, &url, "bob", "hunter2").status, 200);

    // Closed: still in use for the TTL, then free for another address.
    held.send(&request("GET", &url, &[&alice], b""));
    assert_eq!(held.read_response().status, 200);
    drop(held);
    let closed = std::time::Instant::now();
    let r = get_from("127.0.0.2", http, &url, "alice", "secret");
    if closed.elapsed() < TTL / 2 {
        assert_eq!(r.status, 403, "within the TTL: {}", r.head_text());
    }
    let took = wait_for(Duration::from_secs(5), "alice served from 127.0.0.2", || {
        let r = get_from("127.0.0.2", http, &url, "alice", "secret");
        (r.status == 200).then(|| closed.elapsed())
    });
    assert!(took >= TTL, "served {took:?} after the close, before the TTL");
    // Now 127.0.0.1 is the one refused (127.0.0.2's connection closed within the TTL).
    let r = get_from("127.0.0.1", http, &url, "alice", "secret");
    assert_eq!(r.status, 403, "{}", r.head_text());
}

#[tokio::test]
async fn an_http2_stream_from_a_second_address_gets_403() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(&CONFIG.replacen("auth = true\n", "auth = true\nh2c = true\n", 1));
    let url = origin.url("/bytes/3");
    let auth = proxy_auth("alice", "secret");
    let mut held = Conn::open_from("127.0.0.1", proxy.addr());
    held.send(&request("GET", &url, &[&auth], b""));
    assert_eq!(held.read_response().status, 200);

    let tcp = connect_from("127.0.0.2", proxy.addr());
    tcp.set_nonblocking(true).expect("non-blocking");
    let tcp = tokio::net::TcpStream::from_std(tcp).expect("a tokio stream");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut send = send.ready().await.expect("ready");
    let value = format!("Basic {}", base64(b"alice:secret"));
    let req = http::Request::get(&url).header("proxy-authorization", value).body(()).unwrap();
    let (resp, _) = send.send_request(req, true).expect("send the request");
    let resp = resp.await.expect("a response");
    assert_eq!(resp.status(), 403);
    let mut body = resp.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8_lossy(&text);
    assert_eq!(text.trim(), "user alice is already using 1 client addresses (limit 1)");
    drop(held);
}

#[test]
fn a_group_and_a_user_have_limits_of_their_own() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(CONFIG);
    let (http, url) = (proxy.addr(), origin.url("/bytes/3"));
    // bob's group allows two addresses, with the TTL of `[limits]`.
    let bob = proxy_auth("bob", "hunter2");
    let mut held: Vec<Conn> = ["127.0.0.1", "127.0.0.2"]
        .iter()
        .map(|from| {
            let mut c = Conn::open_from(from, http);
            c.send(&request("GET", &url, &[&bob], b""));
            assert_eq!(c.read_response().status, 200, "bob from {from}");
            c
        })
        .collect();
    let r = get_from("127.0.0.3", http, &url, "bob", "hunter2");
    assert_eq!(r.status, 403, "{}", r.head_text());
    assert_eq!(r.text().trim(), "user bob is already using 2 client addresses (limit 2)");
    held.clear();
    // carol is in the same group, but her own limit is one.
    let mut c = Conn::open_from("127.0.0.1", http);
    c.send(&request("GET", &url, &[&proxy_auth("carol", "carol-pw")], b""));
    assert_eq!(c.read_response().status, 200);
    let r = get_from("127.0.0.2", http, &url, "carol", "carol-pw");
    assert_eq!(r.status, 403, "{}", r.head_text());
    assert!(r.text().contains("(limit 1)"), "{}", r.text());
}

#[test]
fn a_limit_of_zero_and_a_misspelt_key_are_refused_at_load() {
    let problems = |text: &str| match rustle::config::Config::parse(text) {
        Ok(_) => Vec::new(),
        Err(p) => p.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
    };
    let p = problems("[limits]\nmax_client_addresses = 0\n");
    assert!(
        p.iter().any(|p| p.contains("limits.max_client_addresses must be at least 1")),
        "{p:?}"
    );
    let p = problems("[auth.group_limits.g]\nmax_client_addresses = 0\n");
    assert!(p.iter().any(|p| p.contains("auth.group_limits.g.max_client_addresses")), "{p:?}");
    let p = problems("[limits]\nclient_address_ttl = \"soon\"\n");
    assert!(!p.is_empty(), "a TTL that is no duration");
    let p = problems("[auth.group_limits.g]\nmax_client_adresses = 2\n");
    assert!(p.iter().any(|p| p.contains("max_client_adresses")), "a misspelt key: {p:?}");
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Network namespaces of this test's own, removed on drop (with what runs in them): the
/// proxy's (`lo` with 198.18.0.1, the origin's address) and two clients', each joined to
/// the proxy's by a veth pair: 10.231.N.2 on the client's side, 10.231.N.1 on the proxy's.
struct Namespaces {
    names: [String; 3],
}

impl Namespaces {
    fn new() -> Namespaces {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = std::process::id();
        let names = ["p", "c1", "c2"].map(|r| format!("rustle-addrs-{id}-{n}-{r}"));
        let ns = Namespaces { names };
        for name in &ns.names {
            ip(&["netns", "add", name]);
        }
        let [p, c1, c2] = &ns.names;
        ip(&["-n", p, "link", "set", "lo", "up"]);
        ip(&["-n", p, "addr", "add", "198.18.0.1/32", "dev", "lo"]);
        for (i, c) in [(1, c1), (2, c2)] {
            let here = format!("v{i}");
            ip(&[
                "-n", p, "link", "add", &here, "type", "veth", "peer", "name", "eth0", "netns", c,
            ]);
            ip(&["-n", p, "addr", "add", &format!("10.231.{i}.1/24"), "dev", &here]);
            ip(&["-n", p, "link", "set", &here, "up"]);
            ip(&["-n", c, "addr", "add", &format!("10.231.{i}.2/24"), "dev", "eth0"]);
            ip(&["-n", c, "link", "set", "eth0", "up"]);
            ip(&["-n", c, "link", "set", "lo", "up"]);
        }
        ns
    }

    /// `program args` inside namespace `i` (0: the proxy's).
    fn command(&self, i: usize, program: &str, args: &[&str]) -> Command {
        let mut cmd = clean_command("ip");
        cmd.args(["netns", "exec", &self.names[i], program]).args(args);
        cmd
    }

    /// The status and body of a GET of the origin through the proxy as alice, by curl in
    /// client namespace `i`.
    fn get(&self, i: usize) -> (u16, String) {
        let proxy = format!("http://alice:secret@10.231.{i}.1:3128");
        let args =
            ["--silent", "--max-time", "5", "-w", "\n%{http_code}", "-x", &proxy, ORIGIN_URL];
        let out = self.command(i, "curl", &args).output().expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.trim().to_string())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert_success(&format!("ip {}", args.join(" ")), &out);
}

/// A child process killed (and reaped) on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const ORIGIN_URL: &str = "http://198.18.0.1:8080/";

/// An origin answering `ok` to every GET.
const ORIGIN: &str = r#"
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
srv = ThreadingHTTPServer(("198.18.0.1", 8080), H)
print("ready", flush=True)
srv.serve_forever()
"#;

/// A client that makes one request as alice on a kept-alive connection, prints the
/// status, and holds the connection until its standard input closes.
const HOLDER: &str = r#"
import sys, http.client, base64
c = http.client.HTTPConnection(sys.argv[1], 3128, timeout=10)
auth = base64.b64encode(b"alice:secret").decode()
c.request("GET", "http://198.18.0.1:8080/", headers={"Proxy-Authorization": "Basic " + auth})
r = c.getresponse()
r.read()
print(r.status, flush=True)
sys.stdin.read()
"#;

/// Starts `script` in namespace `i` and reads its first line.
fn python(ns: &Namespaces, i: usize, script: &str, args: &[&str]) -> (Child, String) {
    let mut all = vec!["-u", "-c", script];
    all.extend_from_slice(args);
    let mut child = ns
        .command(i, "python3", &all)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start python3");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .expect("a first line");
    (Child(child), line.trim().to_string())
}

#[test]
fn from_two_network_namespaces() {
    if !crate::util::peers::is_root() {
        rustle_bench::tools::skip_host("network namespaces need root");
        return;
    }
    if !(have("ip") && have("python3") && have("curl")) {
        return;
    }
    let ns = Namespaces::new();
    let (_origin, ready) = python(&ns, 0, ORIGIN, &[]);
    assert_eq!(ready, "ready");
    let dir = TempDir::new("addrs");
    let file = dir.file("rustle.toml");
    let config = r#"
workers = 1
deny_private_destinations = false
[log]
access = "off"
[[listener]]
listen = "0.0.0.0:3128"
auth = true
[limits]
max_client_addresses = 1
client_address_ttl = "1s"
[[auth.user]]
name = "alice"
password = "plain:secret"
"#;
    std::fs::write(&file, config).expect("write the config");
    let args =
        ["netns", "exec", &ns.names[0], rustle_bin(), "--config", file.to_str().expect("utf-8")];
    let mut rustle = RustleProcess::spawn_program("ip", &args);
    rustle.next_listener();

    let (mut holder, status) = python(&ns, 1, HOLDER, &["10.231.1.1"]);
    assert_eq!(status, "200", "the first client's request");
    let (code, body) = ns.get(2);
    assert_eq!(code, 403, "the second address while the first holds: {body}");
    assert_eq!(body, "user alice is already using 1 client addresses (limit 1)");
    assert!(rustle.wait_for_stderr("10.231.2.2: user alice is already using", TTL * 5));
    // The first address takes another connection meanwhile.
    assert_eq!(ns.get(1).0, 200);

    // The holder leaves; its address is free once idle for the TTL.
    drop(holder.0.stdin.take());
    let _ = holder.0.wait();
    let left = std::time::Instant::now();
    let took = wait_for(Duration::from_secs(5), "the second address served", || {
        (ns.get(2).0 == 200).then(|| left.elapsed())
    });
    assert!(took >= TTL / 2, "served {took:?} after the first address's last close");
    drop(rustle);
}

#[test]
fn check_refuses_limits_for_a_group_nobody_is_in() {
    let dir = TempDir::new("addrs-check");
    let file = dir.file("groups.toml");
    let text = "[[listener]]\nlisten = \"127.0.0.1:3129\"\nauth = true\n\
                [[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n\
                [auth.group_limits.staf]\nmax_client_addresses = 2\n";
    std::fs::write(&file, text).expect("write the config");
    let out = Command::new(rustle_bin())
        .args(["check", "--no-bind", "--config", file.to_str().expect("utf-8")])
        .output()
        .expect("run rustle check");
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auth.group_limits: no user is in the group `staf`"), "{err}");
}
