// Bare epoll TCP relay (level-triggered, one read per event): a floor measurement, not a product.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

struct Conn { s: [TcpStream; 2] }

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = a[1].parse().unwrap();
    let target: SocketAddr = a[2].parse().unwrap();
    let l = TcpListener::bind(listen).unwrap();
    let ep = unsafe { libc::epoll_create1(0) };
    let add = |fd: i32, tok: u64| unsafe {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: tok };
        libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev);
    };
    add(l.as_raw_fd(), u64::MAX);
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut buf = vec![0u8; 16384];
    let mut later: Vec<usize> = Vec::new();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    loop {
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 1024, -1) };
        free.extend(later.drain(..));
        for k in 0..n.max(0) as usize {
            let tok = evs[k].u64;
            if tok == u64::MAX {
                let Ok((c, _)) = l.accept() else { continue };
                let Ok(o) = TcpStream::connect(target) else { continue };
                c.set_nodelay(true).unwrap(); o.set_nodelay(true).unwrap();
                let conn = Conn { s: [c, o] };
                let i = match free.pop() { Some(i) => { conns[i] = Some(conn); i } None => { conns.push(Some(conn)); conns.len() - 1 } };
                let c = conns[i].as_ref().unwrap();
                add(c.s[0].as_raw_fd(), (i as u64) << 1); add(c.s[1].as_raw_fd(), ((i as u64) << 1) | 1);
                continue;
            }
            let i = (tok >> 1) as usize; let d = (tok & 1) as usize;
            let Some(c) = conns[i].as_mut() else { continue };
            let dead = match (&c.s[d]).read(&mut buf) {
                Ok(0) | Err(_) => true,
                Ok(m) => (&c.s[1 - d]).write_all(&buf[..m]).is_err(),
            };
            if dead { conns[i] = None; later.push(i); }
        }
    }
}
