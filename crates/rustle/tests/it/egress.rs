//! Outgoing addresses (`bind`, `interface` on routes), in a network namespace each test
//! makes and removes: `lo` up with IPv4 addresses in 198.18.0.0/24, 2001:db8::1, and a
//! local route for 2001:db8:1::/64 (any address of it is this host's). rustle, an origin
//! that answers with the peer address it sees (HTTP on port 8080, UDP on 9053) and the
//! clients all run inside it (`ip netns exec`). Covered: a fixed address per listener and
//! per user; `same` (HTTP/1 and HTTP/2); a fresh address of the prefix per connection and per request of a
//! kept-alive client; HTTP forward, CONNECT, SOCKS5, a TCP relay, SOCKS5 UDP ASSOCIATE and
//! the UDP relay each leaving from their route's address; a family with no address
//! refused; `interface`; the start-up and reload refusals of a prefix with no local route
//! and of a missing interface.

use std::collections::HashSet;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::util::{assert_success, have, rustle_bin, RustleProcess, TempDir};

/// The origin: HTTP/1.1 (keep-alive) and UDP, both answering with the peer's address
/// (IPv4 ones without their `::ffff:` prefix).
const ORIGIN: &str = r#"
import socket, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

def plain(ip):
    return ip[7:] if ip.startswith("::ffff:") else ip

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = plain(self.client_address[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

class S(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    request_queue_size = 1024
    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

# Bound to its address, not the wildcard: a reply to a local address would otherwise
# leave from that same address, not the one the datagram was sent to.
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("198.18.0.1", 9053))
    while True:
        data, peer = u.recvfrom(2048)
        u.sendto(plain(peer[0]).encode(), peer)

srv = S(("::", 8080), H)
threading.Thread(target=udp, daemon=True).start()
print("ready", flush=True)
srv.serve_forever()
"#;

/// The clients: `many PROXY_HOST PROXY_PORT URL N PARALLEL` (a new client connection per
/// request), `keepalive PROXY_HOST PROXY_PORT URL N` (one connection), `socks-udp
/// SOCKS_HOST SOCKS_PORT DST_IP DST_PORT` (UDP ASSOCIATE) and `udp HOST PORT`. Each prints
/// one answer per line.
const CLIENT: &str = r#"
import sys, socket, struct, http.client
from concurrent.futures import ThreadPoolExecutor

mode = sys.argv[1]
if mode in ("many", "keepalive"):
    host, port, url, n = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    def answer(r):
        body = r.read().decode()
        return body if r.status == 200 else "status %d %s" % (r.status, body.strip())
    if mode == "many":
        def one(_):
            c = http.client.HTTPConnection(host, port, timeout=30)
            c.request("GET", url, headers={"Connection": "close"})
            out = answer(c.getresponse())
            c.close()
            return out
        with ThreadPoolExecutor(int(sys.argv[6])) as ex:
            print("\n".join(ex.map(one, range(n))))
    else:
        c = http.client.HTTPConnection(host, port, timeout=30)
        for _ in range(n):
            c.request("GET", url)
            print(answer(c.getresponse()))
elif mode == "socks-udp":
    host, port, dst, dport = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    t = socket.create_connection((host, port), timeout=10)
    t.sendall(b"\x05\x01\x00")
    assert t.recv(2) == b"\x05\x00"
    t.sendall(b"\x05\x03\x00\x01" + bytes(4) + bytes(2))
    rep = t.recv(10)
    assert rep[1] == 0, rep
    relay = (socket.inet_ntoa(rep[4:8]), struct.unpack("!H", rep[8:10])[0])
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(10)
    u.sendto(b"\x00\x00\x00\x01" + socket.inet_aton(dst) + struct.pack("!H", dport) + b"hi", relay)
    data, _ = u.recvfrom(2048)
    print(data[10:].decode())
elif mode == "udp":
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(10)
    u.sendto(b"hi", (sys.argv[2], int(sys.argv[3])))
    print(u.recvfrom(2048)[0].decode())
"#;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A network namespace of this test's own, removed on drop (with what runs in it).
struct Netns {
    name: String,
}

impl Netns {
    /// `lo` up, 198.18.0.1, .2 and .11 to .16, 2001:db8::1, and 2001:db8:1::/64 and
    /// 198.18.1.0/24 routed locally.
    fn new() -> Netns {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("rustle-egress-{}-{n}", std::process::id());
        let ns = Netns { name };
        ns.ip(&["netns", "add", &ns.name]);
        let mut steps: Vec<String> = [
            "link set lo up",
            "-6 addr add 2001:db8::1/128 dev lo nodad",
            "-6 route add local 2001:db8:1::/64 dev lo",
            "route add local 198.18.1.0/24 dev lo",
        ]
        .map(String::from)
        .into();
        for last in [1, 2, 11, 12, 13, 14, 15, 16] {
            steps.push(format!("addr add 198.18.0.{last}/32 dev lo"));
        }
        for step in steps {
            let mut args = vec!["-n", ns.name.as_str()];
            args.extend(step.split(' '));
            ns.ip(&args);
        }
        ns
    }

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("run ip");
        assert_success(&format!("ip {}", args.join(" ")), &out);
    }

    /// `program args` inside the namespace.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = crate::util::clean_command("ip");
        cmd.args(["netns", "exec", &self.name, program]).args(args);
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program, args).output().expect("run in the namespace")
    }

    /// The client script's lines.
    fn client(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["-c", CLIENT];
        all.extend_from_slice(args);
        let out = self.run("python3", &all);
        assert_success(&format!("client {args:?}"), &out);
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }

    /// curl inside the namespace: its body (the address the origin saw).
    fn curl(&self, args: &[&str]) -> String {
        let mut all = vec!["--silent", "--show-error", "--max-time", "20"];
        all.extend_from_slice(args);
        let out = self.run("curl", &all);
        assert_success(&format!("curl {args:?}"), &out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A child process killed (and reaped) on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Everything one test runs, dropped in order: rustle, the origin, then the namespace.
struct Setup {
    rustle: RustleProcess,
    _origin: Child,
    file: std::path::PathBuf,
    _dir: TempDir,
    ns: Netns,
}

/// Whether this host can run these tests: root, `ip`, python3 and curl.
fn runnable() -> bool {
    if !crate::util::peers::is_root() {
        rustle_bench::tools::skip_host("network namespaces need root");
        return false;
    }
    have("ip") && have("python3") && have("curl")
}

fn origin(ns: &Netns) -> Child {
    let mut child = ns
        .command("python3", &["-u", "-c", ORIGIN])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the origin");
    let mut ready = String::new();
    let stdout = child.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut ready)
        .expect("the origin starts");
    assert_eq!(ready.trim(), "ready");
    Child(child)
}

/// rustle with `config` (and a one-worker, open-proxy preamble) in a fresh namespace,
/// with the origin.
fn setup(config: &str) -> Setup {
    let ns = Netns::new();
    let origin = origin(&ns);
    let dir = TempDir::new("egress");
    let file = dir.file("rustle.toml");
    std::fs::write(&file, format!("{PREAMBLE}{config}")).expect("write the config");
    let args = ["netns", "exec", &ns.name, rustle_bin(), "--config", file.to_str().expect("utf-8")];
    let mut rustle = RustleProcess::spawn_program("ip", &args);
    rustle.next_listener();
    Setup { rustle, _origin: origin, file, _dir: dir, ns }
}

const PREAMBLE: &str = "workers = 1\nallow_open_proxy = true\n[log]\naccess = \"off\"\n";

const LISTENERS_AND_ROUTES: &str = r#"
[[listener]]
name = "fixed"
listen = "198.18.0.1:3128"
[[listener]]
name = "same"
listen = "198.18.0.2:3128"
[[listener]]
name = "rotate"
listen = "198.18.0.1:3129"
[[listener]]
name = "users"
listen = "198.18.0.1:3130"
auth = true
[[listener]]
name = "socks"
kind = "socks"
listen = "198.18.0.1:1080"
[[listener]]
name = "relay"
kind = "relay"
listen = "198.18.0.1:4000"
target = "198.18.0.1:8080"
[[listener]]
name = "udp"
kind = "udp-relay"
listen = "198.18.0.1:5353"
target = "198.18.0.1:9053"
[[listener]]
name = "dev"
listen = "198.18.0.1:3131"
[[listener]]
name = "parent"
listen = "198.18.0.1:3132"
[[listener]]
name = "h2"
listen = "198.18.0.2:3133"
h2c = true
[[parent]]
name = "origin-as-parent"
kind = "http"
address = "198.18.0.1:8080"
[[auth.user]]
name = "alice"
password = "plain:alice-pw"
[[auth.user]]
name = "bob"
password = "plain:bob-pw"

[[route]]
name = "fixed"
listeners = ["fixed"]
via = "direct"
bind = ["198.18.0.11", "2001:db8::1"]
[[route]]
name = "same"
listeners = ["same", "h2"]
via = "direct"
bind = "same"
[[route]]
name = "rotate"
listeners = ["rotate"]
via = "direct"
bind = "2001:db8:1::/64"
[[route]]
name = "alice"
users = ["alice"]
via = "direct"
bind = "198.18.0.12"
[[route]]
name = "bob"
users = ["bob"]
via = "direct"
bind = "198.18.0.13"
[[route]]
name = "socks"
listeners = ["socks"]
via = "direct"
bind = "198.18.0.14"
[[route]]
name = "relays"
listeners = ["relay", "udp"]
via = "direct"
bind = "198.18.0.15"
[[route]]
name = "dev"
listeners = ["dev"]
via = "direct"
bind = "198.18.0.16"
interface = "lo"
[[route]]
name = "parent"
listeners = ["parent"]
via = "origin-as-parent"
bind = "198.18.1.0/24"
bind_pick = "round-robin"
"#;

const V4: &str = "http://198.18.0.1:8080/";
const V6: &str = "http://[2001:db8::1]:8080/";

#[test]
fn each_listener_and_user_leaves_from_its_route_address() {
    if !runnable() {
        return;
    }
    let s = setup(LISTENERS_AND_ROUTES);
    let ns = &s.ns;
    // Per listener, each family from its own address; HTTP forward and CONNECT.
    assert_eq!(ns.curl(&["-x", "http://198.18.0.1:3128", V4]), "198.18.0.11");
    assert_eq!(ns.curl(&["-x", "http://198.18.0.1:3128", V6]), "2001:db8::1");
    assert_eq!(ns.curl(&["-p", "-x", "http://198.18.0.1:3128", V4]), "198.18.0.11");
    // A fixed address is pooled under its own key: a kept-alive client keeps it.
    let kept = ns.client(&["keepalive", "198.18.0.1", "3128", V4, "5"]);
    assert_eq!(kept, vec!["198.18.0.11"; 5]);
    // `same`: the address the client connected to.
    assert_eq!(ns.curl(&["-x", "http://198.18.0.2:3128", V4]), "198.18.0.2");
    // `same` for an HTTP/2 client (h2c, prior knowledge: nghttp has no proxy mode, its
    // `:authority` names the origin).
    if crate::util::have_for_part("nghttp") {
        let authority = ":authority: 198.18.0.1:8080";
        let out = ns.run("nghttp", &["-H", authority, "http://198.18.0.2:3133/"]);
        assert_success("nghttp", &out);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "198.18.0.2");
    }
    // Per user.
    let users = "http://198.18.0.1:3130";
    assert_eq!(ns.curl(&["-x", users, "-U", "alice:alice-pw", V4]), "198.18.0.12");
    assert_eq!(ns.curl(&["-x", users, "-U", "bob:bob-pw", V4]), "198.18.0.13");
    assert_eq!(ns.curl(&["-p", "-x", users, "-U", "bob:bob-pw", V4]), "198.18.0.13");
    // SOCKS5, and its UDP ASSOCIATE. The route has no IPv6 address: reply 4, host
    // unreachable.
    assert_eq!(ns.curl(&["--socks5", "198.18.0.1:1080", V4]), "198.18.0.14");
    let out = ns.run("curl", &["--silent", "--show-error", "--socks5", "198.18.0.1:1080", V6]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("connection to 2001:db8::1. (4)"), "{said}");
    let udp = ns.client(&["socks-udp", "198.18.0.1", "1080", "198.18.0.1", "9053"]);
    assert_eq!(udp, ["198.18.0.14"]);
    // The TCP and UDP relays.
    assert_eq!(ns.curl(&["http://198.18.0.1:4000/"]), "198.18.0.15");
    assert_eq!(ns.client(&["udp", "198.18.0.1", "5353"]), ["198.18.0.15"]);
    // An interface with an address on it.
    assert_eq!(ns.curl(&["-x", "http://198.18.0.1:3131", V4]), "198.18.0.16");
    // Through a parent (the origin, which takes absolute-form requests and says who
    // connected): the connection to the parent leaves from the prefix, a fresh address
    // per request of a kept-alive client.
    let kept = ns.client(&["keepalive", "198.18.0.1", "3132", "http://origin.test/", "20"]);
    let distinct: HashSet<&String> = kept.iter().collect();
    assert!(kept.iter().all(|ip| ip.starts_with("198.18.1.")), "{kept:?}");
    // 20 draws from the /24's 256 addresses: about 0.75 repeats are expected, and 3 or
    // more happen about one time in 35; 6 or more (fewer than 15 distinct) about one in
    // 200,000.
    assert!(distinct.len() >= 15, "{kept:?}");
    drop(s);
}

/// Whether `ip` is inside 2001:db8:1::/64.
fn in_prefix(ip: &str) -> bool {
    ip.parse::<std::net::Ipv6Addr>().is_ok_and(|a| a.segments()[..4] == [0x2001, 0xdb8, 1, 0])
}

#[test]
fn a_prefix_gives_each_connection_and_each_request_an_address_of_its_own() {
    if !runnable() {
        return;
    }
    let s = setup(LISTENERS_AND_ROUTES);
    let ns = &s.ns;
    let seen = ns.client(&["many", "198.18.0.1", "3129", V6, "1000", "32"]);
    assert_eq!(seen.len(), 1000);
    let outside: Vec<&String> = seen.iter().filter(|ip| !in_prefix(ip)).collect();
    assert!(outside.is_empty(), "outside the prefix: {:?}", &outside[..outside.len().min(5)]);
    let distinct: HashSet<&String> = seen.iter().collect();
    assert!(distinct.len() >= 990, "{} distinct of 1000", distinct.len());
    // One kept-alive client connection: a fresh origin connection, and address, per
    // request.
    let kept = ns.client(&["keepalive", "198.18.0.1", "3129", V6, "50"]);
    let distinct: HashSet<&String> = kept.iter().collect();
    assert!(kept.iter().all(|ip| in_prefix(ip)), "{kept:?}");
    assert_eq!(distinct.len(), 50, "{kept:?}");
    // The route has no IPv4 address: an IPv4 destination is refused, saying so.
    let out =
        ns.run("curl", &["--silent", "-w", "%{http_code}", "-x", "http://198.18.0.1:3129", V4]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("502"), "{text}");
    assert!(text.contains("route `rotate` has no IPv4 outgoing address for 198.18.0.1"), "{text}");
    drop(s);
}

/// `rustle check` inside the namespace.
fn check(ns: &Netns, dir: &TempDir, config: &str) -> Output {
    let file = dir.file("check.toml");
    std::fs::write(&file, format!("{PREAMBLE}[[listener]]\nlisten = \"127.0.0.1:0\"\n{config}"))
        .expect("write");
    ns.run(rustle_bin(), &["check", "--no-bind", "--config", file.to_str().expect("utf-8")])
}

const UNROUTED: &str = "[[route]]\nname = \"r\"\nvia = \"direct\"\nbind = \"2001:db8:2::/64\"\n";

#[test]
fn a_prefix_without_a_local_route_and_a_missing_interface_are_refused() {
    if !runnable() {
        return;
    }
    let s = setup(LISTENERS_AND_ROUTES);
    let (ns, dir) = (&s.ns, TempDir::new("egress-check"));
    let out = check(ns, &dir, UNROUTED);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(
            "route `r`: bind prefix 2001:db8:2::/64 has no local route on this host; run \
             `ip -6 route add local 2001:db8:2::/64 dev lo` (and route the prefix to this host \
             upstream), or set `sysctl -w net.ipv6.ip_nonlocal_bind=1`"
        ),
        "{said}"
    );
    let out =
        check(ns, &dir, "[[route]]\nname = \"d\"\nvia = \"direct\"\ninterface = \"nosuch0\"\n");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(said.contains("route `d`: interface `nosuch0` does not exist on this host"), "{said}");
    let out = check(ns, &dir, "[[route]]\nname = \"a\"\nvia = \"direct\"\nbind = \"198.18.9.9\"\n");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(said.contains("bind address 198.18.9.9 is not an address of this host"), "{said}");
    // A reload to it is refused, and the proxy goes on as it was.
    let text = std::fs::read_to_string(&s.file).expect("read");
    std::fs::write(&s.file, format!("{text}{UNROUTED}")).expect("write");
    s.rustle.signal("HUP");
    let limit = Duration::from_secs(5);
    assert!(
        s.rustle.wait_for_stderr("keeping the previous configuration", limit),
        "{}",
        s.rustle.stderr()
    );
    assert!(s.rustle.stderr().contains("ip -6 route add local 2001:db8:2::/64 dev lo"));
    assert_eq!(ns.curl(&["-x", "http://198.18.0.1:3128", V4]), "198.18.0.11");
    // With non-local binding allowed, the prefix is accepted.
    ns.run("sysctl", &["-qw", "net.ipv6.ip_nonlocal_bind=1"]);
    let out = check(ns, &dir, UNROUTED);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
