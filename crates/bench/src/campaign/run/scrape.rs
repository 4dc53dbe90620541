//! Scraping a proxy's metrics endpoint once a second while it is measured,
//! as a monitoring system would, from the client's side: a thread of the
//! campaign doing a plain HTTP GET on loopback, or running curl in the
//! client's namespace.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Prometheus' usual scrape interval is longer; once a second is the
/// busiest a monitoring system commonly asks.
const EVERY: Duration = Duration::from_secs(1);

/// Bound on one scrape, connection included.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Scrapes until [`Scraper::finish`], or until dropped (a run that failed).
pub(super) struct Scraper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(u32, u32)>>,
}

impl Scraper {
    /// Starts scraping `url` (`http://IP:PORT/PATH`) now and every second;
    /// with `via` (the client's argv prefix) through curl run under it.
    pub(super) fn start(url: String, via: Option<Vec<String>>) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut done, mut failed) = (0u32, 0u32);
            while !flag.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let ok = match &via {
                    Some(prefix) => curl(prefix, &url),
                    None => get(&url),
                };
                done += 1;
                failed += u32::from(!ok);
                while t0.elapsed() < EVERY && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            (done, failed)
        });
        Scraper { stop, thread: Some(thread) }
    }

    /// Stops scraping: (scrapes, failed scrapes).
    pub(super) fn finish(mut self) -> (u32, u32) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or((0, 0))
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One GET with `Connection: close`; true on a 200 answer read to its end.
fn get(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else { return false };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let Some(addr) = authority.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let Ok(mut s) = TcpStream::connect_timeout(&addr, TIMEOUT) else { return false };
    let _ = s.set_read_timeout(Some(TIMEOUT));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    if s.read_to_end(&mut answer).is_err() {
        return false;
    }
    answer.starts_with(b"HTTP/1.1 200") || answer.starts_with(b"HTTP/1.0 200")
}

/// The same through `prefix curl` (another namespace than the campaign's).
fn curl(prefix: &[String], url: &str) -> bool {
    let Some((program, args)) = prefix.split_first() else { return false };
    let max = TIMEOUT.as_secs().to_string();
    Command::new(program)
        .args(args)
        .args(["curl", "-sf", "-o", "/dev/null", "--max-time", &max, url])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn counts_scrapes_and_failures() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", l.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = c.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /metrics HTTP/1.1\r\n"));
            c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
            // Dropped: the next scrape finds no listener.
        });
        let s = Scraper::start(url, None);
        server.join().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let (done, failed) = s.finish();
        assert_eq!((done, failed), (2, 1));
        assert!(!get("http://127.0.0.1:1/metrics") && !get("ftp://x"));
    }
}
