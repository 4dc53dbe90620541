//! Ending the open connections of a user who is disabled, removed, or out of quota
//! (`limits::cut`). A connection that authenticates holds its user's shared entry
//! (`limits::UserTraffic`) in a slot here with its client socket's descriptor; the
//! worker's per-second sweep reads each held entry's flag (a relaxed load) and shuts down
//! the sockets of those cut. Every way a connection can be busy then ends at once: a
//! CONNECT or SOCKS tunnel (parked or relaying, spliced or not), an HTTP/1 exchange in
//! flight or a kept-alive wait, an HTTP/2 connection and its streams, a SOCKS5 UDP
//! association (its TCP connection ends it). No timer, no syscall and no check per read:
//! the shutdown is the one syscall, made for cut connections only. The exchange's end
//! (`exchange::end`) finds the reason on the entry and logs it.

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::limits::UserTraffic;

struct Held {
    user: Arc<UserTraffic>,
    /// The client socket, open while the slot is held (the guard holding the slot is
    /// dropped with the connection, or releases it first).
    fd: RawFd,
    /// The user's cut generation when the connection was held: a later cut ends it,
    /// even if the user is restored before the sweep.
    generation: u32,
}

/// A worker's connections of authenticated users.
#[derive(Default)]
pub(crate) struct Cuts {
    slots: RefCell<Vec<Option<Held>>>,
    free: RefCell<Vec<usize>>,
}

impl Cuts {
    /// Holds `user`'s connection on socket `fd` until `release`; counts it open.
    /// `generation`: the user's cut generation read before its cut flag was checked.
    pub(crate) fn hold(&self, user: Arc<UserTraffic>, fd: RawFd, generation: u32) -> usize {
        // Relaxed: a count read for reporting only.
        user.open.fetch_add(1, Ordering::Relaxed);
        let held = Some(Held { user, fd, generation });
        let mut slots = self.slots.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(i) => {
                slots[i] = held;
                i
            }
            None => {
                slots.push(held);
                slots.len() - 1
            }
        }
    }

    /// The user entry held in `slot`.
    pub(crate) fn entry(&self, slot: usize) -> Option<Arc<UserTraffic>> {
        self.slots.borrow().get(slot)?.as_ref().map(|h| h.user.clone())
    }

    /// The connection in `slot` ended.
    pub(crate) fn release(&self, slot: usize) {
        let Some(held) = self.slots.borrow_mut().get_mut(slot).and_then(Option::take) else {
            return;
        };
        held.user.open.fetch_sub(1, Ordering::Relaxed);
        self.free.borrow_mut().push(slot);
    }

    /// Shuts down the sockets of the connections whose user is cut; how many. Each is
    /// released when its connection ends, so a connection is shut down once per sweep at
    /// most until then (a second shutdown of a socket already shut is harmless).
    pub(crate) fn sweep(&self) -> usize {
        let slots = self.slots.borrow();
        let mut n = 0;
        for held in slots.iter().flatten() {
            // Cut, or out of a quota that closes connections (`on_exceeded = "close"`):
            // a plain-HTTP body in flight ends too, not only tunnels at their next read.
            if held.user.cut_since(held.generation) || held.user.cut() {
                crate::io::sys::shutdown_both(held.fd);
                n += 1;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{cut, Cut};
    use std::io::Read as _;

    #[test]
    fn a_sweep_shuts_down_the_sockets_of_cut_users_only() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut a = std::net::TcpStream::connect(addr).expect("connect");
        let (a_server, _) = listener.accept().expect("accept");
        let mut b = std::net::TcpStream::connect(addr).expect("connect");
        let (b_server, _) = listener.accept().expect("accept");
        use std::os::fd::AsRawFd as _;
        let (alice, bob) = (Arc::new(UserTraffic::default()), Arc::new(UserTraffic::default()));
        let cuts = Cuts::default();
        let sa = cuts.hold(alice.clone(), a_server.as_raw_fd(), alice.generation());
        let _sb = cuts.hold(bob.clone(), b_server.as_raw_fd(), bob.generation());
        assert_eq!(alice.open.load(Ordering::Relaxed), 1);
        assert_eq!(cuts.sweep(), 0);
        cut(&alice, Cut::Disabled);
        assert_eq!(cuts.sweep(), 1);
        assert_eq!(alice.cut_reason(), Some(Cut::Disabled));
        let mut buf = [0u8; 8];
        assert_eq!(a.read(&mut buf).expect("eof"), 0, "alice's connection ended");
        b.set_nonblocking(true).expect("nonblocking");
        assert!(b.read(&mut buf).is_err(), "bob's connection goes on (nothing to read)");
        cuts.release(sa);
        assert_eq!(alice.open.load(Ordering::Relaxed), 0);
        assert_eq!(cuts.sweep(), 0);
        alice.restore();
        assert_eq!(alice.cut_reason(), None);
    }

    #[test]
    fn a_cut_holds_for_older_connections_when_the_user_is_restored_before_the_sweep() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut old = std::net::TcpStream::connect(addr).expect("connect");
        let (old_server, _) = listener.accept().expect("accept");
        let mut new = std::net::TcpStream::connect(addr).expect("connect");
        let (new_server, _) = listener.accept().expect("accept");
        use std::os::fd::AsRawFd as _;
        let alice = Arc::new(UserTraffic::default());
        let cuts = Cuts::default();
        let _so = cuts.hold(alice.clone(), old_server.as_raw_fd(), alice.generation());
        // Removed then added back (a password rotation) within one sweep period.
        cut(&alice, Cut::Removed);
        alice.restore();
        assert!(!alice.is_cut());
        let _sn = cuts.hold(alice.clone(), new_server.as_raw_fd(), alice.generation());
        assert_eq!(cuts.sweep(), 1, "only the connection from before the cut");
        let mut buf = [0u8; 8];
        assert_eq!(old.read(&mut buf).expect("eof"), 0, "the old connection ended");
        new.set_nonblocking(true).expect("nonblocking");
        assert!(new.read(&mut buf).is_err(), "the new one goes on");
    }
}
