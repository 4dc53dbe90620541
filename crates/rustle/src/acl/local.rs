//! The addresses of the host's own interfaces, for the built-in checks: a listener on an
//! unspecified address is reached through any of them, and `deny_private_destinations`
//! refuses them all (the host's public addresses included).
//!
//! The kernel's list (getifaddrs) is read at start, on every reload and every
//! [`REFRESH_EVERY`] by the first worker, and kept in one shared snapshot with a
//! generation number. Each thread holds its own copy of the snapshot and compares the
//! generation (one relaxed atomic load) before using it; only a thread that finds it
//! changed takes the lock, once. A check is then that load and a scan of a few addresses:
//! no lock, allocation or syscall per connection.

use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::canonical;

/// How often the first worker reads the interfaces' addresses again: an address added
/// to the host is refused as a destination within this long (a reload reads them at once).
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// The snapshot's generation: 0 until the first read.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static SNAPSHOT: Mutex<Option<Arc<[IpAddr]>>> = Mutex::new(None);

thread_local! {
    /// This thread's copy of the snapshot and its generation.
    static SEEN: RefCell<(u64, Arc<[IpAddr]>)> = RefCell::new((0, Arc::from(Vec::new())));
}

/// Reads the interfaces' addresses again; a new generation only if they changed.
pub(crate) fn refresh() {
    let mut addrs: Vec<IpAddr> = match nix::ifaddrs::getifaddrs() {
        Ok(list) => list
            .filter_map(|ifa| {
                let a = ifa.address?;
                if let Some(v4) = a.as_sockaddr_in() {
                    return Some(IpAddr::V4(v4.ip()));
                }
                a.as_sockaddr_in6().map(|v6| canonical(IpAddr::V6(v6.ip())))
            })
            .collect(),
        Err(e) => {
            tracing::warn!("cannot list the host's addresses (getifaddrs): {e}");
            return;
        }
    };
    addrs.sort();
    addrs.dedup();
    let mut snapshot = SNAPSHOT.lock().unwrap_or_else(PoisonError::into_inner);
    if snapshot.as_deref() == Some(&addrs[..]) {
        return;
    }
    *snapshot = Some(Arc::from(addrs));
    GENERATION.fetch_add(1, Ordering::Release);
}

/// Whether `ip` (mapped IPv6 taken as IPv4) is an address of one of the host's
/// interfaces, as of the last [`refresh`] (the first call makes one when none was).
pub(crate) fn is_local(ip: IpAddr) -> bool {
    let ip = canonical(ip);
    let mut generation = GENERATION.load(Ordering::Acquire);
    if generation == 0 {
        refresh();
        generation = GENERATION.load(Ordering::Acquire);
    }
    SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        if seen.0 != generation {
            let snapshot = SNAPSHOT.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(s) = snapshot.as_ref() {
                seen.1 = s.clone();
            }
            seen.0 = generation;
        }
        seen.1.contains(&ip)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_local_and_documentation_addresses_are_not() {
        assert!(is_local("127.0.0.1".parse().expect("test address")));
        assert!(is_local("::ffff:127.0.0.1".parse().expect("test address")));
        assert!(!is_local("192.0.2.1".parse().expect("test address")));
        assert!(!is_local("2001:db8::1".parse().expect("test address")));
    }
}
