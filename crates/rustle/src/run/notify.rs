//! The service manager's notification protocol (systemd's `sd_notify`): with
//! `Type=notify`, rustle says when it is ready (its listeners bound and its workers
//! started), when a reload begins and ends, and when it stops, as datagrams on the Unix
//! socket `$NOTIFY_SOCKET` names (a path, or `@name` in the abstract namespace). Without
//! that variable nothing is sent. A failure to send is logged once and otherwise ignored:
//! the proxy runs the same.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a send has failed and been logged.
static FAILED: AtomicBool = AtomicBool::new(false);

/// Listeners bound, workers started.
pub(crate) fn ready(status: &str) {
    send(&format!("READY=1\nSTATUS={status}"));
}

/// A reload (SIGHUP) begins: systemd waits for the next `ready` before it takes the
/// reload as done.
pub(crate) fn reloading() {
    send(&format!("RELOADING=1\nMONOTONIC_USEC={}", crate::io::sys::monotonic_usec()));
}

/// Shutdown begins: connections are draining.
pub(crate) fn stopping() {
    send("STOPPING=1");
}

fn send(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let result = (|| {
        let socket = UnixDatagram::unbound()?;
        let bytes = target.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                socket.send_to_addr(state.as_bytes(), &addr)
            }
            None => socket.send_to(state.as_bytes(), &target),
        }
    })();
    if let Err(e) = result {
        if !FAILED.swap(true, Ordering::Relaxed) {
            tracing::warn!("cannot notify the service manager at {target:?}: {e}");
        }
    }
}
