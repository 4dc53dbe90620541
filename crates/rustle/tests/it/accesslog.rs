//! The access log: every format's line for a forward request, a CONNECT tunnel, a SOCKS5
//! tunnel, a denied request and a request through a parent; squid's native format read
//! as squid's tools read it; a template with every field; syslog (UDP and a local
//! datagram socket) and journald sinks against sockets the test binds; one line for each
//! refusal before a target was known; and logrotate's rename + SIGUSR1 under steady
//! traffic losing no line.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustle_bench::pattern::pattern;
use rustle_bench::{Origin, TcpEcho};

use crate::util::socks::{connect5, Dst};
use crate::util::*;

/// Two listeners (`front`: HTTP, `socks`), one requiring a login (`authed`), a rule
/// denying `blocked.test`, and a route sending `localhost` through `parent`.
fn config(format: &str, parent: SocketAddr) -> String {
    format!(
        r#"
[log]
format = '{format}'
[[listener]]
name = "front"
listen = "127.0.0.1:0"
[[listener]]
name = "socks"
kind = "socks"
listen = "127.0.0.1:0"
[[listener]]
name = "authed"
listen = "127.0.0.1:0"
auth = true
[auth]
failures_burst = 1000
[[auth.user]]
name = "alice"
password = "plain:secret"
[[rule]]
name = "no-blocked"
action = "deny"
hosts = ["blocked.test"]
[[parent]]
name = "up"
kind = "http"
address = "{parent}"
[[route]]
name = "via-up"
hosts = ["localhost"]
via = "up"
"#
    )
}

/// What the tests read back from a line, whatever its format.
#[derive(Debug)]
struct Seen {
    method: String,
    target: String,
    status: u16,
    down: u64,
    /// The parent taken.
    parent: Option<String>,
}

fn parse(format: &str, line: &str) -> Seen {
    match format {
        "plain" => {
            let f: Vec<&str> = line.split(' ').collect();
            let parent = f.iter().find_map(|t| t.strip_prefix("via=")).map(str::to_string);
            Seen {
                method: f[2].into(),
                target: f[3].into(),
                status: f[4].parse().unwrap(),
                down: f[6].parse().unwrap(),
                parent,
            }
        }
        "json" => {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            Seen {
                method: v["method"].as_str().unwrap().into(),
                target: v["target"].as_str().unwrap().into(),
                status: v["status"].as_u64().unwrap() as u16,
                down: v["bytes_down"].as_u64().unwrap(),
                parent: v["via"].as_str().map(str::to_string),
            }
        }
        "squid" => {
            let s = Squid::parse(line);
            let parent = s.hierarchy.strip_prefix("FIRST_UP_PARENT/").map(str::to_string);
            Seen { method: s.method, target: s.url, status: s.status, down: s.bytes, parent }
        }
        _ => {
            // TEMPLATE below.
            let f: Vec<&str> = line.split(' ').collect();
            Seen {
                method: f[0].into(),
                target: f[1].into(),
                status: f[2].parse().unwrap(),
                down: f[3].parse().unwrap(),
                parent: (f[4] != "-").then(|| f[4].to_string()),
            }
        }
    }
}

const TEMPLATE: &str = "{method} {target} {status} {bytes_down} {via} {protocol} {listener}";

/// A squid native line, split on whitespace as squid's log tools split it.
#[derive(Debug)]
struct Squid {
    time: f64,
    elapsed: u64,
    client: IpAddr,
    code: String,
    status: u16,
    bytes: u64,
    method: String,
    url: String,
    user: String,
    hierarchy: String,
    content_type: String,
}

impl Squid {
    fn parse(line: &str) -> Squid {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 10, "a squid line has 10 fields: {line:?}");
        let (secs, millis) = f[0].split_once('.').expect("time is SECONDS.MILLIS");
        assert_eq!(millis.len(), 3, "{line}");
        assert!(secs.parse::<u64>().is_ok() && millis.parse::<u16>().is_ok(), "{line}");
        let (code, status) = f[3].split_once('/').expect("CODE/STATUS");
        assert_eq!(status.len(), 3, "the status has three digits: {line}");
        assert!(f[8].contains('/'), "HIERARCHY/HOST: {line}");
        Squid {
            time: f[0].parse().unwrap(),
            elapsed: f[1].parse().unwrap_or_else(|_| panic!("elapsed ms: {line}")),
            client: f[2].parse().unwrap_or_else(|_| panic!("client IP: {line}")),
            code: code.into(),
            status: status.parse().unwrap(),
            bytes: f[4].parse().unwrap(),
            method: f[5].into(),
            url: f[6].into(),
            user: f[7].into(),
            hierarchy: f[8].into(),
            content_type: f[9].into(),
        }
    }
}

/// The exchanges every format is checked on; returns their targets as the lines show
/// them (forward, CONNECT, SOCKS5, denied, through the parent, as alice).
struct Traffic {
    forward: String,
    connect: String,
    socks: String,
    denied: String,
    parented: String,
    authed: String,
}

fn traffic(proxy: &Proxy, origin: &Origin, echo1: &TcpEcho, echo2: &TcpEcho) -> Traffic {
    let forward = origin.url("/bytes/1234");
    let mut c = Conn::open(proxy.addr_of(0));
    c.send(&get(&forward));
    assert_eq!(c.read_response().body, pattern(1234));

    let connect = echo1.addr().to_string();
    let (mut t, r) = connect_with(proxy.addr_of(0), &connect, &[]);
    assert_eq!(r.status, 200);
    assert_echoes(&mut t.s, b"hello");
    drop(t);

    let mut s = connect5(proxy.addr_of(1), &Dst::Addr(echo2.addr()));
    assert_echoes(&mut s, b"socks!");
    drop(s);

    let denied = "http://blocked.test/x".to_string();
    let r = parse_response(&raw_to(proxy.addr_of(0), &get(&denied)));
    assert_eq!(r.status, 403);

    let parented = format!("http://localhost:{}/bytes/7", origin.addr().port());
    let mut c = Conn::open(proxy.addr_of(0));
    c.send(&get(&parented));
    let r = c.read_response();
    assert_eq!(r.body, pattern(7), "{}", r.head_text());

    let authed = origin.url("/bytes/3");
    let req = request("GET", &authed, &[&proxy_auth("alice", "secret")], b"");
    let mut c = Conn::open(proxy.addr_of(2));
    c.send(&req);
    assert_eq!(c.read_response().status, 200);

    Traffic {
        forward,
        connect,
        socks: format!("socks5://{}", echo2.addr()),
        denied,
        parented,
        authed,
    }
}

#[test]
fn every_format_writes_each_kind_of_exchange() {
    let origin = Origin::start().unwrap();
    let (echo1, echo2) = (TcpEcho::start().unwrap(), TcpEcho::start().unwrap());
    let parent = Proxy::start();
    for format in ["plain", "json", "squid", TEMPLATE] {
        let proxy = Proxy::from_toml(&config(format, parent.addr()));
        let t = traffic(&proxy, &origin, &echo1, &echo2);
        let line = |target: &str| {
            let l = proxy.log_line(|l| l.split([' ', '"']).any(|w| w == target));
            (parse(format, &l), l)
        };
        let (s, l) = line(&t.forward);
        assert_eq!((s.method.as_str(), s.status, s.down), ("GET", 200, 1234), "{l}");
        assert_eq!(s.parent, None, "{l}");

        let (s, l) = line(&t.connect);
        assert_eq!((s.method.as_str(), s.status, s.down), ("CONNECT", 200, 5), "{l}");

        // squid shows a SOCKS tunnel as a CONNECT to host:port, its reply as a status.
        let socks_target = match format {
            "squid" => echo2.addr().to_string(),
            _ => t.socks.clone(),
        };
        let (s, l) = line(&socks_target);
        let status = if format == "squid" { 200 } else { 0 };
        assert_eq!((s.method.as_str(), s.status, s.down), ("CONNECT", status, 6), "{l}");

        let (s, l) = line(&t.denied);
        assert_eq!((s.method.as_str(), s.status, s.down), ("GET", 403, 0), "{l}");

        let (s, l) = line(&t.parented);
        assert_eq!((s.status, s.down), (200, 7), "{l}");
        assert_eq!(s.parent.as_deref(), Some("up"), "{l}");

        let (s, l) = line(&t.authed);
        assert_eq!((s.target.as_str(), s.status), (t.authed.as_str(), 200), "{l}");

        if format == TEMPLATE {
            let l = proxy.log_line(|l| l.contains(&t.forward));
            assert!(l.ends_with(" HTTP/1.1 front"), "{l}");
            let l = proxy.log_line(|l| l.contains(&t.socks));
            assert!(l.ends_with(" SOCKS5 socks"), "{l}");
        }
        if format == "json" {
            let l = proxy.log_line(|l| l.contains(&t.socks));
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            assert_eq!(
                (v["listener"].as_str(), v["protocol"].as_str()),
                (Some("socks"), Some("SOCKS5"))
            );
        }
    }
}

#[test]
fn squid_lines_read_as_squid_tools_read_them() {
    let origin = Origin::start().unwrap();
    let (echo1, echo2) = (TcpEcho::start().unwrap(), TcpEcho::start().unwrap());
    let parent = Proxy::start();
    let proxy = Proxy::from_toml(&config("squid", parent.addr()));
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let t = traffic(&proxy, &origin, &echo1, &echo2);
    // A login refused: denied before any upstream.
    let r = parse_response(&raw_to(proxy.addr_of(2), &get(&origin.url("/bytes/1"))));
    assert_eq!(r.status, 407);
    // A request refused before its head was read whole.
    let r =
        parse_response(&raw_to(proxy.addr_of(0), b"GET http://a.test/ HTTP/1.1\r\nBad\r\n\r\n"));
    assert_eq!(r.status, 400);

    let line = |pred: &dyn Fn(&Squid) -> bool| {
        let l = proxy.log_line(|l| pred(&Squid::parse(l)));
        Squid::parse(&l)
    };
    let s = line(&|s| s.url == t.forward);
    assert!(s.time >= before.as_secs_f64() - 1.0 && s.elapsed < 10_000, "{s:?}");
    assert_eq!(s.client, IpAddr::from([127, 0, 0, 1]));
    assert_eq!((s.code.as_str(), s.status, s.bytes), ("TCP_MISS", 200, 1234));
    assert_eq!((s.method.as_str(), s.user.as_str()), ("GET", "-"));
    assert_eq!(s.hierarchy, "HIER_DIRECT/127.0.0.1");
    assert_eq!(s.content_type, "-");

    let s = line(&|s| s.url == t.connect);
    assert_eq!((s.code.as_str(), s.status, s.method.as_str()), ("TCP_TUNNEL", 200, "CONNECT"));
    assert_eq!((s.bytes, s.hierarchy.as_str()), (5, "HIER_DIRECT/127.0.0.1"));

    let socks = echo2.addr().to_string();
    let s = line(&|s| s.url == socks);
    assert_eq!((s.code.as_str(), s.status, s.method.as_str()), ("TCP_TUNNEL", 200, "CONNECT"));

    let s = line(&|s| s.url == t.denied);
    assert_eq!(
        (s.code.as_str(), s.status, s.hierarchy.as_str()),
        ("TCP_DENIED", 403, "HIER_NONE/-")
    );

    let s = line(&|s| s.url == t.parented);
    assert_eq!(
        (s.code.as_str(), s.status, s.hierarchy.as_str()),
        ("TCP_MISS", 200, "FIRST_UP_PARENT/up")
    );

    let s = line(&|s| s.url == t.authed);
    assert_eq!((s.code.as_str(), s.user.as_str()), ("TCP_MISS", "alice"));

    let s = line(&|s| s.status == 407);
    assert_eq!((s.code.as_str(), s.method.as_str(), s.user.as_str()), ("TCP_DENIED", "GET", "-"));

    let s = line(&|s| s.status == 400);
    assert_eq!(
        (s.code.as_str(), s.method.as_str(), s.url.as_str()),
        ("NONE_NONE", "GET", "http://a.test/")
    );
}

/// Every template field, `|`-separated, in the order of this list.
const EVERY_FIELD: [&str; 23] = [
    "time",
    "time_unix",
    "client",
    "client_ip",
    "user",
    "method",
    "target",
    "status",
    "bytes_up",
    "bytes_down",
    "duration",
    "user_agent",
    "referer",
    "listener",
    "protocol",
    "route",
    "via",
    "tls",
    "tls_version",
    "tls_cipher",
    "sni",
    "upstream",
    "error",
];

fn fields(line: &str) -> std::collections::HashMap<&'static str, String> {
    let values: Vec<&str> = line.split('|').collect();
    assert_eq!(values.len(), EVERY_FIELD.len(), "{line}");
    EVERY_FIELD.iter().zip(values).map(|(k, v)| (*k, v.to_string())).collect()
}

#[test]
fn a_template_shows_every_field() {
    let origin = Origin::start().unwrap();
    let parent = Proxy::start();
    let dir = TempDir::new("template");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("c")).unwrap();
    let template: Vec<String> = EVERY_FIELD.iter().map(|f| format!("{{{f}}}")).collect();
    let toml = format!(
        "[log]\nformat = \"{}\"\n\
         [[listener]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nname = \"secure\"\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\n\
         [listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[parent]]\nname = \"up\"\nkind = \"http\"\naddress = \"{}\"\n\
         [[route]]\nname = \"via-up\"\nhosts = [\"localhost\"]\nvia = \"up\"\n",
        template.join("|"),
        files.chain.display(),
        files.key.display(),
        parent.addr()
    );
    let proxy = Proxy::from_toml(&toml);
    let url = format!("http://localhost:{}/bytes/42", origin.addr().port());
    let mut c = Conn::open(proxy.addr_of(0));
    let client = c.s.local_addr().unwrap();
    let ua = "Mozilla/5.0 (X11; \"test\")";
    c.send(&request(
        "POST",
        &url,
        &[&format!("User-Agent: {ua}"), "Referer: http://r.test/"],
        b"abc",
    ));
    assert_eq!(c.read_response().body, pattern(42));
    let f = fields(&proxy.log_line(|l| l.contains("/bytes/42")));
    assert!(f["time"].ends_with('Z') && f["time"].contains('T'), "{f:?}");
    let unix: f64 = f["time_unix"].parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    assert!((now.as_secs_f64() - unix).abs() < 60.0, "{f:?}");
    assert_eq!(f["client"], client.to_string());
    assert_eq!(f["client_ip"], "127.0.0.1");
    assert_eq!(f["user"], "-");
    assert_eq!((f["method"].as_str(), f["target"].as_str()), ("POST", url.as_str()));
    assert_eq!(
        (f["status"].as_str(), f["bytes_up"].as_str(), f["bytes_down"].as_str()),
        ("200", "3", "42")
    );
    assert!(f["duration"].parse::<f64>().is_ok(), "{f:?}");
    // Quotes in a value are escaped, so that a quoted template field stays one field.
    assert_eq!(f["user_agent"], "Mozilla/5.0 (X11; \\\"test\\\")");
    assert_eq!(f["referer"], "http://r.test/");
    assert_eq!((f["listener"].as_str(), f["protocol"].as_str()), ("front", "HTTP/1.1"));
    assert_eq!((f["route"].as_str(), f["via"].as_str()), ("via-up", "up"));
    for k in ["tls", "tls_version", "tls_cipher", "sni", "error"] {
        assert_eq!(f[k], "-", "{k}: {f:?}");
    }
    assert_eq!(f["upstream"], parent.addr().to_string());

    // The TLS fields, on the HTTPS port (curl's client), and an error.
    if have_for_part("curl") {
        let proxy_url = format!("https://localhost:{}", proxy.addr_of(1).port());
        let dead = format!("http://127.0.0.1:{}/", closed_port().port());
        let ca = files.ca.to_str().unwrap();
        let out =
            curl(&["-s", "-o", "/dev/null", "--proxy", &proxy_url, "--proxy-cacert", ca, &dead])
                .unwrap();
        assert!(out.status.code().is_some(), "curl ran");
        let f = fields(&proxy.log_line(|l| l.contains(&dead)));
        assert_eq!((f["listener"].as_str(), f["status"].as_str()), ("secure", "502"));
        assert!(f["tls"].starts_with("TLSv1_3/TLS13_"), "{f:?}");
        assert_eq!(f["tls_version"], "TLSv1_3");
        assert!(f["tls_cipher"].starts_with("TLS13_"), "{f:?}");
        assert_eq!(f["sni"], "localhost");
        assert!(f["error"].contains("refused"), "{f:?}");
        assert!(f["user_agent"].starts_with("curl/"), "{f:?}");
        assert_eq!(f["referer"], "-");
    }
}

#[test]
fn an_unknown_template_field_is_a_problem_with_its_line() {
    let text = "workers = 1\n[log]\naccess = \"off\"\nformat = \"{time} {nope}\"\n";
    let problems = rustle::config::Config::parse(text).unwrap_err();
    let shown: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert!(
        shown.iter().any(|p| p.starts_with("line 4:") && p.contains("unknown field `{nope}`")),
        "{shown:?}"
    );
    let text = "[log]\naccess = \"syslog:udp://nowhere\"\n";
    let shown: Vec<String> =
        rustle::config::Config::parse(text).unwrap_err().iter().map(|p| p.to_string()).collect();
    assert!(shown.iter().any(|p| p.starts_with("line 2:")), "{shown:?}");
}

/// A proxy whose access log goes to `access` (with `log` keys added to `[log]`), and one
/// request through it; returns the proxy and the URL requested.
fn one_request(access: &str, log: &str) -> (Proxy, Origin, String) {
    let origin = Origin::start().unwrap();
    let toml = format!("[log]\naccess = \"{access}\"\n{log}\n");
    let cfg = rustle::config::Config::parse(&toml).expect("valid");
    let proxy = Proxy::start_with(|c| {
        c.log = cfg.log.clone();
    });
    let url = origin.url("/bytes/11");
    let mut c = Conn::open(proxy.addr());
    c.send(&get(&url));
    assert_eq!(c.read_response().body, pattern(11));
    (proxy, origin, url)
}

fn recv_text(read: impl Fn(&mut [u8]) -> std::io::Result<usize>) -> String {
    let mut buf = vec![0u8; 65_536];
    let n = read(&mut buf).expect("a datagram within the read timeout");
    String::from_utf8(buf[..n].to_vec()).expect("UTF-8")
}

#[test]
fn syslog_rfc5424_over_udp() {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let access = format!("syslog:udp://{}", sock.local_addr().unwrap());
    let log = "syslog_format = \"rfc5424\"\nsyslog_facility = \"local0\"\ntag = \"rustle-test\"";
    let (_proxy, _origin, url) = one_request(&access, log);
    let msg = recv_text(|b| sock.recv(b));
    // <PRI>VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA MSG
    let f: Vec<&str> = msg.splitn(8, ' ').collect();
    assert_eq!(f.len(), 8, "{msg}");
    assert_eq!(f[0], "<134>1", "local0 (16) * 8 + info (6): {msg}");
    assert!(f[1].ends_with('Z') && f[1].len() == "2024-12-02T00:40:00.123Z".len(), "{msg}");
    assert!(!f[2].is_empty(), "a host name: {msg}");
    assert_eq!(f[3], "rustle-test");
    assert_eq!(f[4], std::process::id().to_string());
    assert_eq!((f[5], f[6]), ("access", "-"));
    let line = LogLine::parse(f[7]);
    assert_eq!(
        (line.method.as_str(), line.target.as_str(), line.status),
        ("GET", url.as_str(), 200)
    );
    assert!(!msg.contains('\n'), "one message, one line: {msg:?}");
}

#[test]
fn syslog_rfc3164_to_a_local_socket() {
    let dir = TempDir::new("syslog");
    let path = dir.file("log");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (_proxy, _origin, url) = one_request(&format!("syslog:{}", path.display()), "");
    let msg = recv_text(|b| sock.recv(b));
    // <PRI>Mmm dd HH:MM:SS TAG[PID]: MSG, as glibc's syslog() writes it locally.
    let pri_end = msg.find('>').unwrap();
    assert_eq!(&msg[..=pri_end], "<30>", "daemon (3) * 8 + info (6): {msg}");
    let stamp = &msg[pri_end + 1..pri_end + 16];
    let months =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    assert!(months.contains(&&stamp[..3]), "{msg}");
    assert!(stamp[4..6].trim().parse::<u8>().is_ok() && stamp.as_bytes()[9] == b':', "{msg}");
    let rest = &msg[pri_end + 17..];
    let tag = format!("rustle[{}]: ", std::process::id());
    let line = rest.strip_prefix(&tag).unwrap_or_else(|| panic!("TAG[PID]: in {msg:?}"));
    let line = LogLine::parse(line);
    assert_eq!((line.target.as_str(), line.status), (url.as_str(), 200));
}

#[test]
fn journald_native_protocol() {
    let dir = TempDir::new("journal");
    let path = dir.file("socket");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (proxy, _origin, url) =
        one_request(&format!("journald:{}", path.display()), "format = \"json\"");
    let msg = recv_text(|b| sock.recv(b));
    // The native protocol: KEY=VALUE lines (no value here needs the binary form), each
    // key upper case.
    assert!(msg.ends_with('\n'), "{msg:?}");
    let mut fields = std::collections::HashMap::new();
    for l in msg.lines() {
        let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("not KEY=VALUE: {l:?}"));
        assert!(
            k.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
            "{k}"
        );
        assert!(fields.insert(k.to_string(), v.to_string()).is_none(), "{k} twice");
    }
    let m: serde_json::Value =
        serde_json::from_str(&fields["MESSAGE"]).expect("MESSAGE is the JSON line");
    assert_eq!(m["target"], url);
    assert_eq!(fields["PRIORITY"], "6");
    assert_eq!(fields["SYSLOG_IDENTIFIER"], "rustle");
    assert_eq!(fields["RUSTLE_STATUS"], "200");
    assert_eq!(fields["RUSTLE_METHOD"], "GET");
    assert_eq!(fields["RUSTLE_TARGET"], url);
    assert_eq!(fields["RUSTLE_BYTES_DOWN"], "11");
    assert_eq!(fields["RUSTLE_PROTOCOL"], "HTTP/1.1");
    assert_eq!(fields["RUSTLE_LISTENER"], proxy.addr().to_string());
    assert!(fields["RUSTLE_CLIENT"].starts_with("127.0.0.1:"));
}

/// Sends a request whose line is `marker` and waits for its log line: the lines before it
/// are written by then (one worker, one buffer, in order).
fn flush_with_marker(proxy: &Proxy, origin: &Origin, marker: &str) -> String {
    let url = origin.url(marker);
    let mut c = Conn::open(proxy.addr_of(0));
    c.send(&get(&url));
    assert_eq!(c.read_response().status, 200);
    proxy.log_line(|l| l.contains(&url));
    proxy.log_text()
}

#[test]
fn refusals_before_the_target_is_known_log_one_line_each() {
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("refusals");
    let files = rustle::io::tls::write_self_signed("localhost", &dir.path().join("c")).unwrap();
    let proxy = Proxy::from_toml(&format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [[listener]]\nkind = \"https\"\nlisten = \"127.0.0.1:0\"\n\
         [listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n",
        files.chain.display(),
        files.key.display()
    ));

    // A malformed head: its method and target are in the line, with the cause.
    let r = parse_response(&raw_to(
        proxy.addr_of(0),
        b"GET http://a.test/p HTTP/1.1\r\nno colon\r\n\r\n",
    ));
    assert_eq!(r.status, 400);
    // A head too large: what its request line said.
    let big = format!("GET http://b.test/q HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(70_000));
    let r = parse_response(&raw_to(proxy.addr_of(0), big.as_bytes()));
    assert_eq!(r.status, 431);
    // A SOCKS5 greeting offering only no-authentication to a listener that requires a
    // login: refused (0xFF).
    let mut s = connect(proxy.addr_of(1));
    s.write_all(&[5, 1, 0]).unwrap();
    assert_eq!(read_exact_n(&mut s, 2), [5, 0xff]);
    drop(s);
    // A TLS handshake that fails: a ClientHello of one garbage byte.
    let mut s = connect(proxy.addr_of(2));
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0xff]).unwrap();
    let t = Instant::now();
    let (answer, closed) = read_until_close(&mut s);
    assert!(closed && answer.first() == Some(&0x15), "a TLS alert, then the close: {answer:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "closed at the handshake deadline, not at once");

    let text = flush_with_marker(&proxy, &origin, "/bytes/1?marker");
    let count = |pred: &dyn Fn(&LogLine) -> bool| {
        text.lines().map(LogLine::parse).filter(|l| pred(l)).count()
    };
    let one = |what: &str, pred: &dyn Fn(&LogLine) -> bool| {
        assert_eq!(count(pred), 1, "{what}: not exactly one line in\n{text}");
    };
    one("malformed head", &|l| {
        l.status == 400 && l.method == "GET" && l.target == "http://a.test/p"
    });
    one("head too large", &|l| {
        l.status == 431 && l.method == "GET" && l.target == "http://b.test/q"
    });
    one("SOCKS greeting", &|l| l.method == "-" && l.error.contains("authentication"));
    let https = proxy.addr_of(2).to_string();
    assert_eq!(text.lines().count(), 5, "one line per refusal and the marker's:\n{text}");
    let tls_line = text.lines().find(|l| !l.contains("GET") && !l.contains("authentication"));
    let tls_line = tls_line.unwrap_or_else(|| panic!("no TLS line in\n{text}"));
    assert!(tls_line.contains("TLS") || tls_line.contains("handshake"), "{tls_line} ({https})");
}

#[test]
fn http2_and_over_the_limit_refusals_log_one_line_each() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::from_toml(
        "[limits]\nmax_connections_per_client = 2\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n\
         [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n",
    );
    // HTTP/2 with prior knowledge whose first frame is not SETTINGS.
    let mut s = connect(proxy.addr_of(0));
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x09\x00\x00\x00\x00\x00").unwrap();
    let (_, closed) = read_until_close(&mut s);
    assert!(closed, "the connection was not closed");
    let line = proxy.log_line(|l| l.contains("HTTP/2"));
    assert!(line.contains("handshake") || line.contains("connection error"), "{line}");

    // Two SOCKS connections held (each with the start of a greeting, so that the
    // deferred accept takes it): a third is over the per-client limit.
    let start_greeting = || {
        let mut s = connect(proxy.addr_of(1));
        s.write_all(&[5]).unwrap();
        s
    };
    let held = [start_greeting(), start_greeting()];
    let mut over = start_greeting();
    assert!(closed_within(&mut over, Duration::from_secs(5)));
    proxy.log_line(|l| l.contains("too many connections"));
    drop(held);

    let text = flush_with_marker(&proxy, &origin, "/bytes/1?marker");
    let count = |what: &str| text.lines().filter(|l| l.contains(what)).count();
    assert_eq!(count("HTTP/2"), 1, "{text}");
    assert_eq!(count("too many connections"), 1, "{text}");
}

/// logrotate's rename and SIGUSR1 (the `contrib/` file as it is, its path adapted, and
/// the process name its postrotate signals: rustle runs under a name of its own so that
/// no other rustle gets the signal) while a client sends requests without a pause: every
/// request has exactly one line, in the rotated file or the new one. Without systemd
/// (`systemctl` fails, or knows no such unit) the postrotate signals by name. Both files
/// rustle created are readable by no one but the owner and its group.
#[test]
fn logrotate_under_steady_traffic_loses_no_line() {
    use std::os::unix::fs::PermissionsExt as _;
    if !have("logrotate") || !have("pkill") {
        panic!("logrotate and pkill are needed: apt-get install logrotate procps");
    }
    let origin = Origin::start().unwrap();
    let dir = TempDir::new("logrotate");
    let log = dir.file("access.log");
    // A name of at most 15 characters (what pkill -x compares), this test's own.
    let name = format!("rustle{}", std::process::id() % 1_000_000_000);
    let renamed = dir.file(&name);
    std::os::unix::fs::symlink(rustle_bin(), &renamed).unwrap();
    let args = ["--http", "127.0.0.1:0", "--workers", "2", "--access-log", log.to_str().unwrap()];
    let (bin, addr) = RustleProcess::start_bin(renamed.to_str().unwrap(), &args);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&log), 0o640, "the access log as created at the start");
    let contrib = include_str!("../../../../contrib/rustle.logrotate");
    assert!(contrib.contains("pkill -USR1 -x rustle ||"), "{contrib}");
    let conf = contrib
        .replace("/var/log/rustle/access.log", log.to_str().unwrap())
        .replace("-x rustle", &format!("-x {name}"))
        .replace("rustle.service", &format!("{name}-not-a-unit.service"));
    let conf_path = dir.file("logrotate.conf");
    std::fs::write(&conf_path, conf).unwrap();

    let sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (sent, stop, origin_url) = (sent.clone(), stop.clone(), origin.url("/bytes/1"));
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                // New connections, so that both workers serve some.
                let mut c = Conn::open(addr);
                c.send(&get(&format!("{origin_url}?n={n}")));
                assert_eq!(c.read_response().status, 200);
                n += 1;
                sent.store(n, Ordering::Relaxed);
            }
        })
    };
    let lines_in = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let expect_soon = |what: &str, cond: &dyn Fn() -> bool| {
        assert!(wait_until(Duration::from_secs(10), cond), "timed out waiting for {what}");
    };
    expect_soon("lines before the rotation", &|| lines_in(&log).lines().count() >= 50);
    let state = dir.file("state");
    let out = std::process::Command::new("logrotate")
        .args(["-f", "-s", state.to_str().unwrap(), conf_path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "logrotate: {}", String::from_utf8_lossy(&out.stderr));
    assert!(bin.wait_for_stderr("SIGUSR1: reopened", Duration::from_secs(5)), "{}", bin.stderr());
    expect_soon("lines in the new file", &|| lines_in(&log).lines().count() >= 50);
    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();
    let total = sent.load(Ordering::Relaxed);
    let rotated = dir.file("access.log.1");
    let all = || lines_in(&rotated) + &lines_in(&log);
    expect_soon("every line", &|| all().lines().count() >= total);
    let all = all();
    let mut seen = vec![0u32; total];
    for l in all.lines() {
        let n: usize =
            l.split("?n=").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
        seen[n] += 1;
    }
    let wrong: Vec<(usize, u32)> =
        seen.iter().copied().enumerate().filter(|(_, c)| *c != 1).collect();
    assert!(wrong.is_empty(), "requests without exactly one line (n, lines): {wrong:?}");
    assert!(lines_in(&rotated).lines().count() >= 50, "the rotated file has the early lines");
    assert_eq!(mode(&log), 0o640, "the access log as reopened on SIGUSR1");
    drop(bin);
}

#[test]
fn an_access_log_that_cannot_be_opened_is_named_in_the_error() {
    let dir = TempDir::new("nolog");
    let log = dir.path().join("missing/access.log");
    let out = std::process::Command::new(rustle_bin())
        .args(["--http", "127.0.0.1:0", "--access-log", log.to_str().unwrap()])
        .env("RUSTLE_CONFIG", "")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Refused by the start-up checks, before any file is opened: the message names the
    // file and what is wrong with it.
    let want = format!(
        "{}: its directory {} does not exist",
        log.display(),
        dir.path().join("missing").display()
    );
    assert!(err.contains(&want), "{err}");
    // A path the checks pass but that cannot be opened (a directory): the open's error
    // names it.
    let out = std::process::Command::new(rustle_bin())
        .args(["--http", "127.0.0.1:0", "--access-log", dir.path().to_str().unwrap()])
        .env("RUSTLE_CONFIG", "")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!("cannot open the access log {}: Is a directory", dir.path().display());
    assert!(err.contains(&want), "{err}");
}

/// The refusals for credentials of each front end, sent to `proxy` (listener 0: SOCKS
/// with auth and SOCKS4 user ids, listener 1: HTTP with auth): a SOCKS5 login with a
/// wrong password, a SOCKS5 greeting without username/password, a SOCKS4 user id that
/// names nobody, a CONNECT with a wrong password.
fn refuse_credentials(proxy: &Proxy, target: SocketAddr) {
    use crate::util::socks::{login5, read_reply4, request4, CONNECT};
    let mut s = connect(proxy.addr_of(0));
    assert_ne!(login5(&mut s, "alice", "hunter2"), 0, "a wrong password passed");
    drop(s);
    let mut s = connect(proxy.addr_of(0));
    s.write_all(&[5, 1, 0]).unwrap();
    assert_eq!(read_exact_n(&mut s, 2), [5, 0xff]);
    drop(s);
    let SocketAddr::V4(v4) = target else { panic!("{target}") };
    let mut s = connect(proxy.addr_of(0));
    s.write_all(&request4(CONNECT, v4, "nobody", None)).unwrap();
    assert_eq!(read_reply4(&mut s).0, 0x5B);
    drop(s);
    let (_, r) = connect_with(proxy.addr_of(1), &target.to_string(), &[&proxy_auth("alice", "x")]);
    assert_eq!(r.status, 407, "{}", r.text());
}

fn credentials_config(format: &str) -> String {
    format!(
        "[log]\nformat = '{format}'\n\
         [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\nauth = true\nsocks4_users = true\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n\
         [auth]\nfailures_burst = 1000\n\
         [[auth.user]]\nname = \"alice\"\npassword = \"plain:secret\"\n"
    )
}

#[test]
fn refusals_for_credentials_are_logged_as_refusals_and_as_squid_writes_them() {
    let echo = TcpEcho::start().unwrap();
    // What squid itself writes for a login it refuses.
    let opts =
        crate::util::peers::SquidOptions { basic_auth: Some(("alice".into(), "secret".into())) };
    let Some(squid) = crate::util::peers::Squid::start(opts) else {
        panic!("squid (with basic_ncsa_auth) is not installed: apt-get install squid")
    };
    let (_, r) = connect_with(squid.addr(), &echo.addr().to_string(), &[&proxy_auth("alice", "x")]);
    assert_eq!(r.status, 407, "{}", r.text());
    let reference = Squid::parse(&squid.access_line(|l| l.contains(" CONNECT ")));
    assert_eq!((reference.code.as_str(), reference.status), ("TCP_DENIED", 407));

    // squid's format: each refusal as squid writes a refused login.
    let proxy = Proxy::from_toml(&credentials_config("squid"));
    refuse_credentials(&proxy, echo.addr());
    let lines = proxy.log_lines_matching(4, |_| true);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    for line in &lines {
        let s = Squid::parse(line);
        assert_eq!(
            (s.code.as_str(), s.status, s.hierarchy.as_str()),
            (reference.code.as_str(), reference.status, reference.hierarchy.as_str()),
            "{line}"
        );
    }

    // The plain format: SOCKS5's refusals with the reply of that meaning (2, not
    // allowed), never 0 (succeeded); SOCKS4's with its 91; HTTP's 407.
    let proxy = Proxy::from_toml(&credentials_config("plain"));
    refuse_credentials(&proxy, echo.addr());
    let lines = proxy.log_lines_matching(4, |_| true);
    let mut statuses: Vec<u16> = lines.iter().map(|l| LogLine::parse(l).status).collect();
    statuses.sort();
    assert_eq!(statuses, [2, 2, 91, 407], "{lines:#?}");
    for line in &lines {
        assert!(line.contains("authentication"), "no cause named: {line}");
        assert!(!line.contains("hunter2"), "a password in the log: {line}");
    }
}

/// A CONNECT parent that answers 200, echoes the tunnel's bytes, and dies when told:
/// `reset` with a reset (as a crashing host's stack answers), otherwise with a plain
/// close of its socket, as the kernel closes a killed process's sockets.
pub(crate) fn dying_parent(reset: bool) -> (SocketAddr, std::sync::mpsc::Sender<()>) {
    use std::io::Read as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (die, dying) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
        let _ = dying.recv();
        if reset {
            socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
        }
        drop(s);
    });
    (addr, die)
}

#[test]
fn a_tunnel_cut_by_a_dying_parent_is_logged_with_the_cause() {
    for reset in [false, true] {
        let (parent, die) = dying_parent(reset);
        let proxy = Proxy::from_toml(&format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\n\
             [[parent]]\nname = \"frail\"\nkind = \"http\"\naddress = \"{parent}\"\n\
             [[route]]\nname = \"all\"\nvia = \"frail\"\n"
        ));
        let (mut t, r) = connect_with(proxy.addr(), "origin.test:443", &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_echoes(&mut t.s, b"hello");
        die.send(()).unwrap();
        // The client sees the tunnel end, then what it still sends meets the dead
        // parent's socket.
        t.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        let end = std::io::Read::read(&mut t.s, &mut buf);
        assert!(matches!(end, Ok(0) | Err(_)), "reset {reset}: {end:?}");
        let _ = t.s.write_all(b"after the parent died");
        drop(t);
        let line = proxy.log_line(|l| l.contains("CONNECT"));
        let l = LogLine::parse(&line);
        assert_eq!(l.target, "origin.test:443", "{line}");
        // The quoted cause ends the line (after `route=` and `via=`).
        assert!(line.ends_with('"'), "reset {reset}: logged as a clean end: {line}");
        let cause = "\"through parent \\\"frail\\\": upstream connection: ";
        assert!(line.contains(cause), "reset {reset}: the parent is not named: {line}");
    }
}
