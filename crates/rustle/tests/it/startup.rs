//! Starting the real binary: an address another process already serves, the open-file
//! limit and accept errors at it, `rustle check` of mistakes only the whole file shows,
//! and the subcommands' help and hints.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use rustle_bench::pattern::pattern;
use rustle_bench::Origin;

use crate::util::*;

/// A loopback port free right now (TCP or UDP).
fn free_port(udp: bool) -> u16 {
    match udp {
        false => std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(),
        true => std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(),
    }
}

/// Starts a first instance with `flag VALUE`, VALUE made from a fixed free address, then
/// a second one the same way: the second must exit with an error naming the address, the
/// first keep running. Returns the first and its address.
fn second_instance_is_refused(
    flag: &str,
    value: impl Fn(&str) -> String,
    udp: bool,
) -> (RustleProcess, SocketAddr) {
    let addr = format!("127.0.0.1:{}", free_port(udp));
    let args = [flag, &value(&addr), "--workers", "2"];
    let mut first = RustleProcess::spawn_bin(rustle_bin(), &args);
    assert_eq!(first.next_listener().to_string(), addr);
    let mut second = RustleProcess::spawn_bin(rustle_bin(), &args);
    let status = second
        .wait(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("a second rustle on {addr} kept running: {}", second.stderr()));
    assert!(!status.success(), "second instance: {status}");
    let err = second.stderr();
    assert!(
        err.lines().any(|l| l.contains(&addr) && l.contains("already in use")),
        "the second instance's error does not name {addr}: {err}"
    );
    assert!(!err.contains("listening on"), "{err}");
    assert_eq!(first.wait(Duration::from_millis(100)), None, "the first instance stopped");
    (first, addr.parse().unwrap())
}

#[test]
fn a_second_instance_on_the_same_tcp_port_is_refused() {
    let origin = Origin::start().unwrap();
    let (_first, addr) = second_instance_is_refused("--http", |a| a.to_string(), false);
    // The first has the port to itself: every connection is served by it.
    for _ in 0..4 {
        let mut c = Conn::open(addr);
        c.send(&get(&origin.url("/bytes/10")));
        assert_eq!(c.read_response().body, pattern(10));
    }
}

#[test]
fn a_second_instance_on_the_same_udp_port_is_refused() {
    let target = free_port(true);
    second_instance_is_refused("--udp-relay", |a| format!("{a}=127.0.0.1:{target}"), true);
}

/// `FIELD soft hard` of /proc/PID/limits for open files.
fn nofile_of(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].parse().unwrap(), fields[4].parse().unwrap())
}

#[test]
fn the_soft_file_limit_is_raised_to_the_hard_one_with_a_warning_when_low() {
    if !have("prlimit") {
        return;
    }
    let args = ["--nofile=1024:4096", rustle_bin(), "--http", "127.0.0.1:0", "--workers", "1"];
    let mut p = RustleProcess::spawn_bin("prlimit", &args);
    p.next_listener();
    assert_eq!(nofile_of(p.child.id()), (4096, 4096), "{}", p.stderr());
    // 4096 descriptors are too few for the default 10,000 connections: said once, with the
    // figures.
    let err = p.stderr();
    assert!(err.contains("open-file limit raised from 1024 to 4096"), "{err}");
    let warned: Vec<&str> =
        err.lines().filter(|l| l.contains("open-file limit") && l.contains("below")).collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(warned[0].contains("4096") && warned[0].contains("10000"), "{err}");
    drop(p);

    // Enough for what the configuration allows: no warning.
    let dir = TempDir::new("nofile");
    let file = dir.file("rustle.toml");
    std::fs::write(
        &file,
        "workers = 1\n[limits]\nmax_connections = 1000\n\
         [[listener]]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let args = ["--nofile=1024:4096", rustle_bin(), "--config", file.to_str().unwrap()];
    let mut p = RustleProcess::spawn_bin("prlimit", &args);
    p.next_listener();
    assert_eq!(nofile_of(p.child.id()), (4096, 4096));
    let err = p.stderr();
    assert!(!err.contains("below"), "{err}");
}

#[test]
fn accept_errors_at_the_file_limit_are_logged_once_a_second() {
    if !have("prlimit") {
        return;
    }
    let origin = Origin::start().unwrap();
    let args = ["--nofile=64:64", rustle_bin(), "--http", "127.0.0.1:0", "--workers", "1"];
    let mut p = RustleProcess::spawn_bin("prlimit", &args);
    let addr = p.next_listener();
    // Clients that send the start of a head each hold a descriptor of the proxy (until the
    // header timeout); more than the limit leaves the rest in the backlog, accept failing.
    let mut held = Vec::new();
    for _ in 0..80 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET http://example.test/ HTTP/1.1\r\n").unwrap();
        held.push(s);
    }
    assert!(p.wait_for_stderr("Too many open files", Duration::from_secs(10)), "{}", p.stderr());
    // The scenario: the proxy stays at its file limit for 2 s, during which its accept
    // loop backs off and says so a few times, not once per try.
    std::thread::sleep(Duration::from_millis(2000));
    drop(held);
    // Accepting again: a request is served.
    let body = wait_for(Duration::from_secs(5), "a request served after the clients left", || {
        let mut c = Conn::open(addr);
        c.send(&get(&origin.url("/bytes/10")));
        let r = c.read_response();
        (r.status == 200).then_some(r.body)
    });
    assert_eq!(body, pattern(10));
    let err = p.stderr();
    let lines = err.lines().filter(|l| l.contains("Too many open files")).count();
    assert!((1..=4).contains(&lines), "{lines} lines about the file limit in 2 s: {err}");
    assert!(!err.contains("Some("), "{err}");
    assert!(err.contains(&format!("accept on {addr}")), "{err}");
}

fn check(text: &str) -> (bool, String) {
    let dir = TempDir::new("check");
    let file = dir.file("rustle.toml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(rustle_bin())
        .args(["check", "--config", file.to_str().unwrap()])
        .output()
        .expect("run rustle check");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Starts the binary on a file; its exit status and standard error when it exits within
/// 10 s, None when it starts.
fn start_on(text: &str) -> Option<(ExitStatus, String)> {
    let dir = TempDir::new("start");
    let file = dir.file("rustle.toml");
    std::fs::write(&file, text).unwrap();
    let mut p = RustleProcess::spawn_bin(rustle_bin(), &["--config", file.to_str().unwrap()]);
    let status = p.wait(Duration::from_secs(10))?;
    Some((status, p.stderr()))
}

#[test]
fn check_and_start_refuse_a_relay_to_an_own_listener() {
    let (port, http, udp) = (free_port(false), free_port(false), free_port(true));
    let cases = [
        // A relay to itself.
        format!("[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:{port}\"\ntarget = \"127.0.0.1:{port}\"\n"),
        // To another listener of this proxy, named as localhost.
        format!(
            "[[listener]]\nlisten = \"127.0.0.1:{http}\"\n\
             [[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:{port}\"\ntarget = \"localhost:{http}\"\n"
        ),
        // A UDP relay to itself.
        format!("[[listener]]\nkind = \"udp-relay\"\nlisten = \"127.0.0.1:{udp}\"\ntarget = \"127.0.0.1:{udp}\"\n"),
    ];
    for text in &cases {
        let target_line = text.lines().position(|l| l.starts_with("target")).unwrap() + 1;
        let (ok, err) = check(text);
        assert!(!ok, "check passed a relay loop:\n{text}");
        assert!(
            err.contains(&format!("line {target_line}:")) && err.contains("own listener"),
            "{text}\n{err}"
        );
        let (status, err) = start_on(text).expect("rustle started with a relay loop");
        assert!(!status.success() && err.contains("own listener"), "{text}\n{err}");
    }
    // The same from the command line.
    let relay = format!("127.0.0.1:{port}=127.0.0.1:{port}");
    let mut p = RustleProcess::spawn_bin(rustle_bin(), &["--relay", &relay]);
    let status = p.wait(Duration::from_secs(10)).expect("rustle started with a relay loop");
    assert!(!status.success() && p.stderr().contains("own listener"), "{}", p.stderr());
    // A TCP relay to a UDP listener's port number is no loop.
    let text = format!(
        "[[listener]]\nkind = \"udp-relay\"\nlisten = \"127.0.0.1:{udp}\"\ntarget = \"127.0.0.1:9\"\n\
         [[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:{port}\"\ntarget = \"127.0.0.1:{udp}\"\n"
    );
    let (ok, err) = check(&text);
    assert!(ok, "{err}");
}

#[test]
fn check_and_start_refuse_routing_mistakes_with_their_lines() {
    let port = free_port(false);
    let listener = format!("[[listener]]\nlisten = \"127.0.0.1:{port}\"\n");
    let corp = "[[parent]]\nname = \"corp\"\nkind = \"http\"\naddress = \"192.0.2.1:3128\"\n";
    // (the file after the listener, the key of the line named, part of the message)
    let cases = [
        (
            format!("{corp}[[route]]\nvia = [\"corp\", \"exit\"]\n"),
            "via",
            "names no parent or group `exit`",
        ),
        (format!("{corp}[[route]]\nvia = [\"corp\", \"corp\"]\n"), "via", "through `corp` twice"),
        (
            "[[group]]\nname = \"exits\"\nparents = []\n".to_string(),
            "parents",
            "at least one parent",
        ),
        (corp.replace("192.0.2.1:3128", &format!("localhost:{port}")), "address", "own listener"),
        // A user group no user is in (known once the users are loaded).
        (
            "[[route]]\ngroups = [\"nobody\"]\nvia = \"direct\"\n".to_string(),
            "groups",
            "route 1: group `nobody` is not defined",
        ),
    ];
    for (tail, key, message) in &cases {
        let text = format!("{listener}{tail}");
        let line = text.lines().position(|l| l.starts_with(key)).unwrap() + 1;
        let (ok, err) = check(&text);
        assert!(!ok, "check passed:\n{text}");
        assert!(err.contains(&format!("line {line}:")) && err.contains(message), "{text}\n{err}");
        let (status, err) = start_on(&text).expect("rustle started");
        assert!(!status.success() && err.contains(message), "{text}\n{err}");
    }
    let (ok, err) = check(&format!("{listener}{corp}[[route]]\nvia = \"corp\"\n"));
    assert!(ok, "{err}");
}

#[test]
fn check_and_start_refuse_a_rule_naming_an_unknown_group() {
    let user = "[[auth.user]]\nname = \"alice\"\npassword = \"plain:pw\"\ngroups = [\"staff\"]\n";
    let text = format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n{user}\
         [[rule]]\naction = \"allow\"\ngroups = [\"staff\"]\n\
         [[rule]]\naction = \"allow\"\ngroups = [\"admins\"]\n"
    );
    let line = text.lines().position(|l| l.contains("admins")).unwrap() + 1;
    let (ok, err) = check(&text);
    assert!(!ok, "check passed a rule naming an unknown group");
    assert!(
        err.lines().any(|l| l.contains(&format!("line {line}:")) && l.contains("`admins`")),
        "{err}"
    );
    assert!(!err.contains("`staff`"), "{err}");
    let (status, err) = start_on(&text).expect("rustle started with an unknown group");
    assert!(!status.success() && err.contains("`admins`"), "{err}");

    // Groups of a users file count, and so does a group declared empty in [auth.groups].
    let dir = TempDir::new("groups");
    let users = dir.file("users");
    std::fs::write(&users, "bob:plain:pw:admins\n").unwrap();
    let text = format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nauth = true\n{user}\
         [auth]\nusers_file = \"{}\"\n[auth.groups]\nauditors = []\n\
         [[rule]]\naction = \"allow\"\ngroups = [\"admins\", \"staff\", \"auditors\"]\n",
        users.display()
    );
    let (ok, err) = check(&text);
    assert!(ok, "{err}");
}

#[test]
fn subcommands_list_only_their_own_options() {
    for (sub, config) in [("cert", false), ("passwd", false), ("check", true)] {
        let out = Command::new(rustle_bin()).args([sub, "--help"]).output().unwrap();
        assert_success(&format!("rustle {sub} --help"), &out);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.contains("--config"), config, "rustle {sub} --help:\n{text}");
    }
    let out = Command::new(rustle_bin()).arg("--help").output().unwrap();
    assert_success("rustle --help", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("--config"));
}

#[test]
fn cert_names_the_curl_options_that_trust_the_ca() {
    let dir = TempDir::new("cert");
    let out = Command::new(rustle_bin())
        .args(["cert", "--self-signed", "proxy.test", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_success("rustle cert", &out);
    let text = String::from_utf8_lossy(&out.stdout);
    let ca = dir.file("ca.pem");
    let ca = ca.display();
    // The HTTPS proxy port: the proxy's certificate is checked with --proxy-cacert.
    assert!(
        text.contains(&format!("curl --proxy https://proxy.test:PORT --proxy-cacert {ca}")),
        "{text}"
    );
    // A TLS relay is the server itself to curl: --cacert.
    assert!(text.contains(&format!("curl --cacert {ca} https://proxy.test:PORT/")), "{text}");
    assert!(text.contains("--tls-cert") && text.contains("--tls-key"), "{text}");
}

#[test]
fn check_and_start_report_every_problem_at_once_with_its_line() {
    let dir = TempDir::new("every");
    let (port, relay) = (free_port(false), free_port(false));
    let missing = |name: &str| dir.file(name).display().to_string();
    let users = dir.file("users");
    std::fs::write(&users, "alice:plain:pw:staff\n").unwrap();
    // (a line of the file, part of the problem it must be reported with; "" for none)
    let file: &[(String, &str)] = &[
        ("[timeouts]".into(), ""),
        // A type error first: it hides nothing after it.
        ("header = \"ten seconds\"".into(), "invalid duration"),
        ("[auth]".into(), ""),
        (format!("users_file = \"{}\"", users.display()), ""),
        ("[tls]".into(), ""),
        (format!("origin_ca = \"{}\"", missing("ca.pem")), "the origin CA file"),
        ("[[listener]]".into(), ""),
        (format!("listen = \"127.0.0.1:{port}\""), ""),
        ("auth = true".into(), ""),
        ("[[listener]]".into(), ""),
        ("kind = \"https\"".into(), ""),
        ("listen = \"127.0.0.1:0\"".into(), ""),
        ("[listener.tls]".into(), ""),
        (format!("cert = \"{}\"", missing("cert.pem")), "the certificate of listener 2"),
        (format!("key = \"{}\"", missing("key.pem")), "the key of listener 2"),
        ("[[listener]]".into(), ""),
        ("kind = \"relay\"".into(), ""),
        (format!("listen = \"127.0.0.1:{relay}\""), ""),
        (format!("target = \"127.0.0.1:{port}\""), "own listener"),
        ("[[rule]]".into(), ""),
        ("action = \"allow\"".into(), ""),
        ("groups = [\"staf\"]".into(), "group `staf` is not defined"),
        ("users = [\"bob\"]".into(), "user `bob` is not defined"),
        ("[state]".into(), ""),
        ("backend = \"redis\"".into(), ""),
        ("redis_url = \"rediss://127.0.0.1:1\"".into(), ""),
        (format!("redis_ca = \"{}\"", missing("redis-ca.pem")), "the Redis CA file"),
    ];
    let text: String = file.iter().map(|(l, _)| format!("{l}\n")).collect();
    let path = dir.file("rustle.toml");
    std::fs::write(&path, &text).unwrap();
    let expect = |err: &str| {
        let reported: Vec<&str> = err.lines().filter(|l| l.contains(": line ")).collect();
        for (n, (_, want)) in file.iter().enumerate().filter(|(_, (_, w))| !w.is_empty()) {
            let at = format!("{}: line {}: ", path.display(), n + 1);
            assert!(
                reported.iter().any(|l| l.starts_with(&at) && l.contains(want)),
                "no `{want}` at line {}:\n{err}",
                n + 1
            );
        }
        let wanted = file.iter().filter(|(_, w)| !w.is_empty()).count();
        assert_eq!(reported.len(), wanted, "one line per problem:\n{err}");
        assert!(err.contains("cannot read"), "{err}");
    };
    let out = Command::new(rustle_bin())
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .expect("run rustle check");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let check_err = String::from_utf8_lossy(&out.stderr).into_owned();
    expect(&check_err);
    // Start-up shows the same list, and binds nothing.
    let mut p = RustleProcess::spawn_bin(rustle_bin(), &["--config", path.to_str().unwrap()]);
    let status = p.wait(Duration::from_secs(10)).expect("rustle started");
    assert_eq!(status.code(), Some(2), "{}", p.stderr());
    let start_err = p.stderr();
    expect(&start_err);
    assert_eq!(start_err.trim_end(), check_err.trim_end());
}

#[test]
fn the_default_file_is_read_without_config_and_the_log_names_it() {
    let dir = TempDir::new("default");
    let file = dir.file("rustle.toml");
    std::fs::write(&file, "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:0\"\n").unwrap();
    // RUSTLE_CONFIG names the default file (/etc/rustle/rustle.toml otherwise).
    let env = [("RUSTLE_CONFIG", file.as_os_str())];
    let mut p = RustleProcess::spawn_env(&["--workers", "1"], &env);
    let addr = p.next_listener();
    let err = p.stderr();
    assert!(err.contains(&format!("configuration: {}", file.display())), "{err}");
    // The file's listener: SOCKS5 answers a greeting.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut reply = [0u8; 2];
    std::io::Read::read_exact(&mut s, &mut reply).unwrap();
    assert_eq!(reply, [5, 0]);
    // `rustle check` without --config checks it too.
    let out = Command::new(rustle_bin()).arg("check").env("RUSTLE_CONFIG", &file).output().unwrap();
    assert_success("rustle check", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{}: ok", file.display())));

    // A listener flag replaces the file's listeners, the rest of the file still applies.
    std::fs::write(&file, "[log]\naccess = \"off\"\n").unwrap();
    let mut p = RustleProcess::spawn_env(&["--http", "127.0.0.1:0", "--workers", "1"], &env);
    let addr = p.next_listener();
    let origin = Origin::start().unwrap();
    let mut c = Conn::open(addr);
    c.send(&get(&origin.url("/bytes/10")));
    assert_eq!(c.read_response().body, pattern(10));
    assert!(p.stderr().contains(&format!("configuration: {}", file.display())), "{}", p.stderr());

    // No such file: the command line and the defaults, and the log says so.
    let gone = dir.file("gone.toml");
    let env = [("RUSTLE_CONFIG", gone.as_os_str())];
    let mut p = RustleProcess::spawn_env(&["--http", "127.0.0.1:0", "--workers", "1"], &env);
    p.next_listener();
    let said = format!("no configuration file ({} does not exist)", gone.display());
    assert!(p.stderr().contains(&said), "{}", p.stderr());
    let out = Command::new(rustle_bin()).arg("check").env("RUSTLE_CONFIG", &gone).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config FILE"), "{out:?}");
}
