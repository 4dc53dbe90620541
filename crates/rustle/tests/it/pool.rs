//! The worker's pool of idle origin connections: an idle kept-alive client holds no
//! origin connection, so the origin connections rustle keeps open follow its pool's
//! limits (`[upstream] pool_max_idle_per_host`, `pool_max_idle`), not the number of
//! clients; a client back from idling, or sending a burst, reuses a pooled connection.
//! The origin fixture counts the connections open at its end. One worker, so one pool.

use std::io::{self, Read};
use std::time::Duration;

use rustle_bench::pattern::pattern;
use rustle_bench::Origin;

use crate::util::*;

/// The answer's size: small, so 500 of them in flight stay cheap.
const BODY: usize = 1000;

/// Whether this process may open `need` descriptors; raises the soft limit (never past
/// the hard one) when it is lower, and says why when it cannot.
fn enough_files(need: u64) -> bool {
    use rlimit::Resource;
    let Ok((soft, hard)) = Resource::NOFILE.get() else {
        rustle_bench::tools::skip_host("cannot read the open-file limit");
        return false;
    };
    if soft >= need {
        return true;
    }
    if hard >= need && Resource::NOFILE.set(need, hard).is_ok() {
        return true;
    }
    rustle_bench::tools::skip_host(&format!(
        "this test needs {need} open files; the limits are {soft} (soft), {hard} (hard)"
    ));
    false
}

/// Opens `n` client connections, writes one kept-alive GET on each (the `i`th to
/// `urls[i % urls.len()]`) before reading any answer, then reads all `n` answers and
/// checks each is whole. The connections are returned open and idle.
fn burst(proxy: &Proxy, urls: &[String], n: usize) -> Vec<Conn> {
    let mut clients: Vec<Conn> = (0..n).map(|_| Conn::to_proxy(proxy)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(&get(&urls[i % urls.len()]));
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let r = c.read_response();
        assert_eq!(r.status, 200, "client {i}: {}", r.head_text());
        assert!(
            r.body == pattern(BODY),
            "client {i}: a body of {} bytes, not the pattern",
            r.body.len()
        );
        let close = r.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        assert!(!close, "client {i} was not kept alive: {}", r.head_text());
    }
    clients
}

/// Waits (up to 5 s) until `open()` is at most `max`, and returns it. Once every answer
/// has been read nothing opens a new origin connection, so the count only goes down.
fn settles_at_most(max: u64, open: impl Fn() -> u64) -> u64 {
    wait_until(Duration::from_secs(5), || open() <= max);
    let now = open();
    assert!(now <= max, "{now} origin connections still open, at most {max} expected");
    now
}

/// Asserts every client connection is still open and has nothing unread: the proxy has
/// neither closed an idle client nor sent it anything.
fn all_open_and_idle(clients: &[Conn]) {
    for (i, c) in clients.iter().enumerate() {
        c.s.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        match (&c.s).read(&mut byte) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok(0) => panic!("the proxy closed idle client {i}"),
            other => panic!("idle client {i}: {other:?}"),
        }
        c.s.set_nonblocking(false).unwrap();
    }
}

#[test]
fn idle_clients_hold_no_more_origin_connections_than_the_pool_allows() {
    const CLIENTS: usize = 500;
    const MAX_IDLE: u64 = 50;
    // Each client costs four descriptors in this process: its socket, the proxy's for it,
    // and at most one origin connection at both ends.
    if !enough_files(4 * CLIENTS as u64 + 512) {
        return;
    }
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|cfg| {
        cfg.workers = 1;
        cfg.upstream.pool_max_idle_per_host = MAX_IDLE as usize;
    });
    let url = origin.url(&format!("/bytes/{BODY}"));
    let clients = burst(&proxy, &[url], CLIENTS);
    let open = settles_at_most(MAX_IDLE, || origin.open_connections());
    all_open_and_idle(&clients);
    assert_eq!(origin.requests(), CLIENTS as u64);
    eprintln!(
        "{CLIENTS} idle clients: {} origin connections opened, {open} still open",
        origin.connections()
    );
}

#[test]
fn a_client_returning_after_idling_gets_a_pooled_connection() {
    const CLIENTS: usize = 5;
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|cfg| cfg.workers = 1);
    let url = origin.url(&format!("/bytes/{BODY}"));
    let mut clients: Vec<Conn> = (0..CLIENTS).map(|_| Conn::to_proxy(&proxy)).collect();
    let ask = |c: &mut Conn, what: &str| {
        c.send(&get(&url));
        let r = c.read_response();
        assert_eq!(r.status, 200, "{what}: {}", r.head_text());
        assert!(r.body == pattern(BODY), "{what}: a body of {} bytes", r.body.len());
    };
    // Warm up: each client in turn, twice round.
    for round in 0..2 {
        for (i, c) in clients.iter_mut().enumerate() {
            ask(c, &format!("warm-up round {round}, client {i}"));
        }
    }
    // One exchange at a time: every client took the one pooled connection.
    let warm = origin.connections();
    assert_eq!(warm, 1, "{CLIENTS} kept-alive clients taking turns used {warm} origin connections");
    for (i, c) in clients.iter_mut().enumerate() {
        // The idling is what is tested: a real wait.
        std::thread::sleep(Duration::from_millis(300));
        ask(c, &format!("client {i} after idling"));
        assert_eq!(
            origin.connections(),
            warm,
            "client {i} back from idling made a new origin connection"
        );
    }
    assert_eq!(origin.requests(), 3 * CLIENTS as u64);
}

#[test]
fn a_burst_from_one_client_reuses_one_origin_connection() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|cfg| cfg.workers = 1);
    let url = origin.url(&format!("/bytes/{BODY}"));
    let mut c = Conn::to_proxy(&proxy);
    for i in 0..100 {
        c.send(&get(&url));
        let r = c.read_response();
        assert_eq!(r.status, 200, "request {i}: {}", r.head_text());
        assert!(r.body == pattern(BODY), "request {i}: a body of {} bytes", r.body.len());
    }
    assert_eq!(origin.requests(), 100);
    assert_eq!(
        origin.connections(),
        1,
        "a burst on one client connection took more than one origin connection"
    );
}

#[test]
fn the_pool_limit_holds_across_origins() {
    const CLIENTS: usize = 200;
    const MAX_IDLE: u64 = 30;
    if !enough_files(4 * CLIENTS as u64 + 512) {
        return;
    }
    let (a, b) = (Origin::start().unwrap(), Origin::start().unwrap());
    let proxy = Proxy::start_with(|cfg| {
        cfg.workers = 1;
        cfg.upstream.pool_max_idle = MAX_IDLE as usize;
        // Each origin alone could keep all its connections.
        cfg.upstream.pool_max_idle_per_host = CLIENTS;
    });
    let urls = [a.url(&format!("/bytes/{BODY}")), b.url(&format!("/bytes/{BODY}"))];
    let clients = burst(&proxy, &urls, CLIENTS);
    let open = settles_at_most(MAX_IDLE, || a.open_connections() + b.open_connections());
    all_open_and_idle(&clients);
    assert_eq!(a.requests() + b.requests(), CLIENTS as u64);
    eprintln!(
        "{CLIENTS} idle clients, two origins: {} + {} origin connections opened, {open} still open",
        a.connections(),
        b.connections()
    );
}
