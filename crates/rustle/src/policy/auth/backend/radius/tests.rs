//! The backend against a real FreeRADIUS (rustle_bench::radiusd): PAP and CHAP, the reply
//! attributes in the Grant, failover, all servers down, and accounting read back from the
//! server's detail file; and against a fake server on a thread for the replies FreeRADIUS
//! does not send (no Message-Authenticator).

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use md5::{Digest, Md5};

use rustle_bench::radiusd::Radiusd;

use super::*;
use crate::config::RadiusBackend;

/// alice: groups in Filter-Id, an egress address, a Class and a Session-Timeout, in a
/// signed reply (FreeRADIUS signs a reply that lists a Message-Authenticator); carol's
/// groups in a Vendor-Specific attribute (WISPr, 14122) beside a bandwidth; mallory is
/// refused whatever her password.
const USERS: &str = r#"
alice	Cleartext-Password := "wonderland"
	Filter-Id = "staff",
	Filter-Id = "vpn",
	Framed-IP-Address = 127.0.0.7,
	Class = "plan-gold",
	Session-Timeout = 120,
	Message-Authenticator = 0x00

carol	Cleartext-Password := "c4rol"
	WISPr-Location-Name = "lab",
	WISPr-Bandwidth-Max-Down = 8000000

mallory	Cleartext-Password := "m", Auth-Type := Reject
"#;

fn settings(servers: &[String], server: &Radiusd, extra: &str) -> RadiusBackend {
    let list: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    let timeout = if extra.contains("timeout") { "" } else { "timeout = \"2s\"" };
    let text = format!(
        "servers = [{}]\nsecret_file = {:?}\n{timeout}\n{extra}",
        list.join(", "),
        server.secret_file().display().to_string(),
    );
    toml::from_str(&text).expect("settings")
}

fn on(server: &Radiusd) -> String {
    format!("127.0.0.1:{}", server.auth_port())
}

fn ask(user: &str, password: &str) -> Ask {
    Ask {
        user: user.into(),
        password: password.as_bytes().to_vec(),
        client: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)),
        listener: "test".into(),
        protocol: "http",
        target: Some("example.com:443".into()),
    }
}

/// A UDP port nothing listens on (the kernel answers port unreachable).
fn dead_port() -> String {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    format!("127.0.0.1:{}", s.local_addr().expect("addr").port())
}

#[tokio::test]
async fn pap_accepts_with_the_reply_mapped_and_refuses_wrong_passwords() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let r = Radius::new(&settings(&[on(&server)], &server, "")).expect("backend");
    let Verdict::Allow(grant) = r.check(&ask("alice", "wonderland")).await.expect("answer") else {
        panic!("alice refused: {}", server.log());
    };
    assert_eq!(grant.groups, ["staff", "vpn"]);
    assert_eq!(grant.egress, Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 7))));
    assert_eq!(grant.ttl, Some(Duration::from_secs(120)));
    assert_eq!(grant.class.as_deref(), Some(&b"plan-gold"[..]));
    assert_eq!(r.check(&ask("alice", "wrong")).await, Ok(Verdict::Deny));
    assert_eq!(r.check(&ask("nobody", "x")).await, Ok(Verdict::Deny));
    assert_eq!(r.check(&ask("mallory", "m")).await, Ok(Verdict::Deny));
    // Nothing User-Password can carry: refused without a call.
    assert_eq!(r.check(&ask("alice", &"x".repeat(129))).await, Ok(Verdict::Deny));
    assert_eq!(server.auth_requests(), 4, "{}", server.log());
}

#[tokio::test]
async fn chap_accepts_and_refuses() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let r = Radius::new(&settings(&[on(&server)], &server, "method = \"chap\"")).expect("backend");
    assert!(matches!(r.check(&ask("alice", "wonderland")).await, Ok(Verdict::Allow(_))));
    assert_eq!(r.check(&ask("alice", "wonderlanD")).await, Ok(Verdict::Deny));
    let log = server.log();
    assert!(log.contains("Login OK: [alice]") && log.contains("chap"), "{log}");
}

#[tokio::test]
async fn vendor_specific_groups_and_bandwidth_are_read() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let extra = "group_attribute = \"14122:2\"\nbandwidth_attribute = \"14122:8\"";
    let r = Radius::new(&settings(&[on(&server)], &server, extra)).expect("backend");
    let Verdict::Allow(grant) = r.check(&ask("carol", "c4rol")).await.expect("answer") else {
        panic!("carol refused: {}", server.log());
    };
    assert_eq!(grant.groups, ["lab"]);
    assert_eq!(grant.bandwidth, Some(1_000_000));
}

#[tokio::test]
async fn a_dead_first_server_is_passed_over_then_asked_last() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let dead = dead_port();
    let r = Radius::new(&settings(&[dead.clone(), on(&server)], &server, "")).expect("backend");
    assert!(matches!(r.check(&ask("alice", "wonderland")).await, Ok(Verdict::Allow(_))));
    assert!(r.auth[0].down_until.load(Ordering::Relaxed) > 0, "the dead server is marked");
    // Marked down, it is asked after the live one: no send to it at all now.
    let t = Instant::now();
    assert_eq!(r.check(&ask("alice", "nope")).await, Ok(Verdict::Deny));
    assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    assert_eq!(server.auth_requests(), 2);
}

#[tokio::test]
async fn a_silent_server_costs_its_share_of_the_timeout_then_the_next_answers() {
    let Some(server) = Radiusd::start(USERS) else { return };
    // A socket that reads and never answers: a server that is there but silent.
    let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let silent_addr = format!("127.0.0.1:{}", silent.local_addr().expect("addr").port());
    let r = Radius::new(&settings(&[silent_addr, on(&server)], &server, "retries = 0"))
        .expect("backend");
    let t = Instant::now();
    assert!(matches!(r.check(&ask("alice", "wonderland")).await, Ok(Verdict::Allow(_))));
    // timeout 2s over 2 servers, 1 send each: about 1 s on the silent one.
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(1900), "{took:?}");
    let mut buf = [0u8; 4096];
    silent.set_nonblocking(true).expect("nonblocking");
    let n = silent.recv(&mut buf).expect("the silent server got the request");
    assert_eq!(buf[0], packet::ACCESS_REQUEST);
    assert!(n > 20);
}

#[tokio::test]
async fn no_server_answering_is_a_failure_and_a_restarted_one_is_asked_again() {
    let Some(mut server) = Radiusd::start(USERS) else { return };
    let r = Radius::new(&settings(&[on(&server)], &server, "")).expect("backend");
    server.kill();
    let got = r.check(&ask("alice", "wonderland")).await;
    assert!(matches!(got, Err(Failure::Unreachable(_))), "{got:?}");
    let r2 = Radius::new(&settings(&[dead_port(), dead_port()], &server, "")).expect("backend");
    assert!(matches!(r2.check(&ask("alice", "wonderland")).await, Err(Failure::Unreachable(_))));
    server.restart().expect("restart");
    // Down, it is still asked when it is the only one left.
    assert!(matches!(r.check(&ask("alice", "wonderland")).await, Ok(Verdict::Allow(_))));
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_timeout() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = format!("127.0.0.1:{}", silent.local_addr().expect("addr").port());
    let r = Radius::new(&settings(&[addr], &server, "timeout = \"300ms\"\nretries = 5"))
        .expect("backend");
    let t = Instant::now();
    assert_eq!(r.check(&ask("alice", "wonderland")).await, Err(Failure::Timeout));
    assert!(t.elapsed() < Duration::from_millis(800), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_wrong_secret_is_no_answer() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let mut cfg = settings(&[on(&server)], &server, "timeout = \"500ms\"\nretries = 0");
    let other = server.dir().join("other-secret");
    std::fs::write(&other, "not-the-secret\n").expect("write");
    cfg.secret_file = other;
    let r = Radius::new(&cfg).expect("backend");
    // FreeRADIUS drops a request whose Message-Authenticator does not verify.
    let got = r.check(&ask("alice", "wonderland")).await;
    assert!(matches!(got, Err(Failure::Unreachable(_) | Failure::Timeout)), "{got:?}");
}

#[tokio::test]
async fn calls_beyond_max_in_flight_are_refused_at_once() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let r = Radius::new(&settings(&[on(&server)], &server, "max_in_flight = 1")).expect("backend");
    let held = r.slots.try_acquire().expect("the one slot");
    assert_eq!(r.check(&ask("alice", "wonderland")).await, Err(Failure::Overloaded));
    drop(held);
    assert!(matches!(r.check(&ask("alice", "wonderland")).await, Ok(Verdict::Allow(_))));
}

#[tokio::test]
async fn accounting_start_interim_stop_reach_the_detail_file() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let dead = dead_port();
    let extra = format!(
        "accounting_servers = [{dead:?}, \"127.0.0.1:{}\"]\nnas_ip_address = \"127.0.0.1\"",
        server.acct_port()
    );
    let cfg = settings(&[on(&server)], &server, &extra);
    assert_eq!(cfg.accounting_interval(), Some(Duration::from_secs(300)));
    let r = Radius::new(&cfg).expect("backend");
    let mut rec = AcctRecord {
        kind: AcctKind::Start,
        session_id: "rustle-s1".into(),
        user: "alice".into(),
        client: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)),
        bytes_in: 0,
        bytes_out: 0,
        secs: 0,
        class: Some(b"plan-gold".to_vec()),
    };
    r.account(&rec).await.expect("start");
    rec.kind = AcctKind::Interim;
    (rec.bytes_in, rec.bytes_out, rec.secs) = (1234, 5_000_000_000, 300);
    r.account(&rec).await.expect("interim");
    rec.kind = AcctKind::Stop;
    (rec.bytes_in, rec.bytes_out, rec.secs) = (2345, 6_000_000_123, 420);
    r.account(&rec).await.expect("stop");

    let detail = server.detail();
    let records: Vec<&str> =
        detail.split("\n\n").filter(|b| b.contains("Acct-Status-Type")).collect();
    assert_eq!(records.len(), 3, "{detail}");
    let has = |i: usize, line: &str| {
        assert!(
            records[i].lines().any(|l| l.trim() == line),
            "record {i} lacks `{line}`:\n{}",
            records[i]
        );
    };
    for (i, status) in ["Start", "Interim-Update", "Stop"].iter().enumerate() {
        has(i, &format!("Acct-Status-Type = {status}"));
        has(i, "Acct-Session-Id = \"rustle-s1\"");
        has(i, "User-Name = \"alice\"");
        has(i, "NAS-Identifier = \"rustle\"");
        has(i, "NAS-IP-Address = 127.0.0.1");
        has(i, "Calling-Station-Id = \"127.0.0.9\"");
        has(i, "Class = 0x706c616e2d676f6c64");
    }
    // 5_000_000_000 = 1 * 2^32 + 705_032_704.
    has(1, "Acct-Input-Octets = 1234");
    has(1, "Acct-Output-Octets = 705032704");
    has(1, "Acct-Output-Gigawords = 1");
    has(1, "Acct-Session-Time = 300");
    has(2, "Acct-Input-Octets = 2345");
    has(2, "Acct-Output-Octets = 1705032827");
    has(2, "Acct-Session-Time = 420");
    has(2, "Acct-Terminate-Cause = User-Request");
    assert!(!records[0].contains("Acct-Input-Octets"), "{}", records[0]);
}

#[tokio::test]
async fn accounting_off_sends_nothing() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let cfg = settings(&[on(&server)], &server, "accounting = false");
    assert_eq!(cfg.accounting_interval(), None);
    let r = Radius::new(&cfg).expect("backend");
    let rec = AcctRecord {
        kind: AcctKind::Start,
        session_id: "s".into(),
        user: "alice".into(),
        client: IpAddr::V4(Ipv4Addr::LOCALHOST),
        bytes_in: 0,
        bytes_out: 0,
        secs: 0,
        class: None,
    };
    r.account(&rec).await.expect("nothing to send");
    assert_eq!(server.detail(), "");
}

#[test]
fn settings_that_cannot_work_are_refused_naming_why() {
    let dir = std::env::temp_dir().join(format!("rustle-radius-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let empty = dir.join("empty");
    std::fs::write(&empty, "\nsecond line\n").expect("write");
    let cfg = |secret: &std::path::Path| -> RadiusBackend {
        toml::from_str(&format!(
            "servers = [\"127.0.0.1:1812\"]\nsecret_file = {:?}",
            secret.display().to_string()
        ))
        .expect("settings")
    };
    let e = Radius::new(&cfg(&empty)).err().expect("refused");
    assert!(e.contains("first line is empty"), "{e}");
    let e = Radius::new(&cfg(&dir.join("missing"))).err().expect("refused");
    assert!(e.contains("secret_file") && e.contains("missing"), "{e}");
    let good = dir.join("good");
    std::fs::write(&good, "s3cret\r\n").expect("write");
    let r = Radius::new(&cfg(&good)).expect("backend");
    assert_eq!(&*r.secret, b"s3cret");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Filter-Id, the default `group_attribute`.
const FILTER_ID: u8 = 11;

/// The secret the fake servers share with the backends of these tests.
const FAKE_SECRET: &[u8] = b"fake-s3cret";

/// A scratch directory holding `FAKE_SECRET` in `secret`.
fn fake_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rustle-radius-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("secret"), [FAKE_SECRET, b"\n"].concat()).expect("write");
    dir
}

fn fake_settings(addr: &str, dir: &std::path::Path, extra: &str) -> RadiusBackend {
    let text = format!(
        "servers = [{addr:?}]\nsecret_file = {:?}\nretries = 0\ntimeout = \"400ms\"\n{extra}",
        dir.join("secret").display().to_string()
    );
    toml::from_str(&text).expect("settings")
}

/// A server on a thread answering every Access-Request with an Access-Accept carrying
/// `attributes`, its Response Authenticator right, with a Message-Authenticator when
/// `signed`; it counts the requests and stops after 5 s without one.
fn fake_server(signed: bool, attributes: Vec<(u8, Vec<u8>)>) -> (String, Arc<AtomicUsize>) {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = format!("127.0.0.1:{}", socket.local_addr().expect("addr").port());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    socket.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            seen.fetch_add(1, Ordering::Relaxed);
            let reply = fake_reply(&buf[..n], packet::ACCESS_ACCEPT, signed, &attributes);
            let _ = socket.send_to(&reply, from);
        }
    });
    (addr, count)
}

/// A response to `request` as a server holding `FAKE_SECRET` writes one.
fn fake_reply(request: &[u8], code: u8, signed: bool, attributes: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut p = vec![code, request[1], 0, 0];
    p.extend_from_slice(&request[4..20]);
    if signed {
        p.extend_from_slice(&[kind::MESSAGE_AUTHENTICATOR, 18]);
        p.extend_from_slice(&[0; 16]);
    }
    for (k, v) in attributes {
        p.push(*k);
        p.push(v.len() as u8 + 2);
        p.extend_from_slice(v);
    }
    let len = p.len() as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    if signed {
        // Over the packet with the Request Authenticator in place (RFC 3579 3.2).
        let mac = packet::hmac_md5(FAKE_SECRET, &p);
        p[22..38].copy_from_slice(&mac);
    }
    let auth = Md5::new().chain_update(&p).chain_update(FAKE_SECRET).finalize();
    p[4..20].copy_from_slice(&auth);
    p
}

#[tokio::test]
async fn replies_without_message_authenticator_are_dropped_unless_allowed() {
    let dir = fake_dir("blast");
    let (unsigned, count) = fake_server(false, vec![(FILTER_ID, b"staff".to_vec())]);
    let r = Radius::new(&fake_settings(&unsigned, &dir, "")).expect("backend");
    // BlastRADIUS: an Access-Accept a forger could have made is no answer at all.
    let got = r.check(&ask("alice", "any")).await;
    assert!(matches!(got, Err(Failure::Unreachable(_) | Failure::Timeout)), "{got:?}");
    assert_eq!(count.load(Ordering::Relaxed), 1, "the fake server answered");
    let legacy = fake_settings(&unsigned, &dir, "require_message_authenticator = false");
    let r = Radius::new(&legacy).expect("backend");
    let Ok(Verdict::Allow(grant)) = r.check(&ask("alice", "any")).await else {
        panic!("a legacy server's reply refused");
    };
    assert_eq!(grant.groups, ["staff"]);
    // The same reply signed passes the default.
    let (signed, _) = fake_server(true, vec![(FILTER_ID, b"staff".to_vec())]);
    let r = Radius::new(&fake_settings(&signed, &dir, "")).expect("backend");
    assert!(matches!(r.check(&ask("alice", "any")).await, Ok(Verdict::Allow(_))));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn logins_never_wait_for_accounting_servers_that_do_not_answer() {
    let Some(server) = Radiusd::start(USERS) else { return };
    let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let silent_addr = format!("127.0.0.1:{}", silent.local_addr().expect("addr").port());
    let extra = format!("accounting_servers = [{silent_addr:?}]\nmax_in_flight = 1\nretries = 0");
    let r = Radius::new(&settings(&[on(&server)], &server, &extra)).expect("backend");
    let rec = |id: &str| AcctRecord {
        kind: AcctKind::Start,
        session_id: id.into(),
        user: "alice".into(),
        client: IpAddr::V4(Ipv4Addr::LOCALHOST),
        bytes_in: 0,
        bytes_out: 0,
        secs: 0,
        class: None,
    };
    let (a, b) = (rec("s1"), rec("s2"));
    // Two records hold and wait for the one accounting slot for the whole timeout (2 s)
    // while logins come and go on theirs.
    let logins = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t = Instant::now();
        for _ in 0..3 {
            assert!(matches!(r.check(&ask("alice", "wonderland")).await, Ok(Verdict::Allow(_))));
        }
        assert_eq!(r.check(&ask("alice", "wrong")).await, Ok(Verdict::Deny));
        t.elapsed()
    };
    let (ra, rb, took) = tokio::join!(r.account(&a), r.account(&b), logins);
    assert!(took < Duration::from_millis(1000), "logins waited {took:?}");
    assert!(matches!(ra, Err(Failure::Timeout | Failure::Unreachable(_))), "{ra:?}");
    assert!(matches!(rb, Err(Failure::Timeout | Failure::Unreachable(_))), "{rb:?}");
    let mut buf = [0u8; 4096];
    silent.set_nonblocking(true).expect("nonblocking");
    let n = silent.recv(&mut buf).expect("the silent server got a record");
    assert_eq!((buf[0], n > 20), (packet::ACCOUNTING_REQUEST, true));
    assert_eq!(server.auth_requests(), 4, "{}", server.log());
}

/// bob is accepted under another spelling (a server matching names without case, or
/// adding a realm, says which in User-Name); dave's name comes back as given; erin's group
/// is no group name.
const SPELLINGS: &str = r#"
bob	Cleartext-Password := "b0b"
	User-Name := "Bob",
	Filter-Id = "staff"

dave	Cleartext-Password := "d4ve"
	User-Name := "dave",
	Filter-Id = "staff"

erin	Cleartext-Password := "3rin"
	Filter-Id = "staff, admin"
"#;

#[tokio::test]
async fn an_accept_under_another_user_name_is_refused_and_groups_are_checked() {
    let Some(server) = Radiusd::start(SPELLINGS) else { return };
    let r = Radius::new(&settings(&[on(&server)], &server, "")).expect("backend");
    assert_eq!(r.check(&ask("bob", "b0b")).await, Ok(Verdict::Deny), "{}", server.log());
    assert!(server.log().contains("Login OK: [bob]"), "the server accepted: {}", server.log());
    let Ok(Verdict::Allow(grant)) = r.check(&ask("dave", "d4ve")).await else {
        panic!("dave refused: {}", server.log());
    };
    assert_eq!(grant.groups, ["staff"]);
    let got = r.check(&ask("erin", "3rin")).await;
    assert!(
        matches!(&got, Err(Failure::Protocol(e)) if e.contains("\"staff, admin\" is not a group name")),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_user_name_differing_byte_for_byte_is_refused() {
    let dir = fake_dir("spelling");
    for (presented, answered, allowed) in
        [("ALICE", "alice", false), ("alice", "alice@realm", false), ("alice", "alice", true)]
    {
        let (addr, _) = fake_server(true, vec![(kind::USER_NAME, answered.as_bytes().to_vec())]);
        let r = Radius::new(&fake_settings(&addr, &dir, "")).expect("backend");
        let got = r.check(&ask(presented, "any")).await;
        assert_eq!(matches!(got, Ok(Verdict::Allow(_))), allowed, "{presented} as {answered}");
        if !allowed {
            assert_eq!(got, Ok(Verdict::Deny));
        }
    }
    let (addr, _) = fake_server(true, vec![(FILTER_ID, vec![b's', 0xff])]);
    let r = Radius::new(&fake_settings(&addr, &dir, "")).expect("backend");
    assert!(matches!(r.check(&ask("alice", "any")).await, Err(Failure::Protocol(_))));
    let _ = std::fs::remove_dir_all(&dir);
}
