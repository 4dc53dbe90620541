// Bare io_uring TCP relay: a floor measurement, not a product.
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, IntoRawFd};

const BUF: usize = 16384;
const OP_ACCEPT: u64 = 0;
const OP_CONNECT: u64 = 1;
const OP_RECV: u64 = 2; // + dir
const OP_SEND: u64 = 4; // + dir

struct Conn { fd: [i32; 2], buf: [Box<[u8]>; 2], len: [usize; 2], off: [usize; 2], ops: u32, dead: bool, addr: libc::sockaddr_in }

fn ud(idx: usize, op: u64) -> u64 { ((idx as u64) << 8) | op }

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = a[1].parse().unwrap();
    let target: SocketAddr = a[2].parse().unwrap();
    let SocketAddr::V4(t4) = target else { panic!() };
    let l = TcpListener::bind(listen).unwrap();
    let lfd = l.into_raw_fd();
    let mut ring: IoUring<squeue::Entry, cqueue::Entry> = IoUring::builder().setup_single_issuer().setup_defer_taskrun().setup_cqsize(8192).build(4096).unwrap();
    let mut conns: Vec<Option<Box<Conn>>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut pend: Vec<squeue::Entry> = Vec::new();
    pend.push(opcode::AcceptMulti::new(types::Fd(lfd)).build().user_data(ud(0, OP_ACCEPT)));
    loop {
        {
            let mut sq = ring.submission();
            for e in pend.drain(..) { unsafe { sq.push(&e).unwrap(); } }
        }
        ring.submitter().submit_and_wait(1).unwrap();
        let cqes: Vec<(u64, i32, u32)> = ring.completion().map(|c| (c.user_data(), c.result(), c.flags())).collect();
        for (u, res, flags) in cqes {
            let op = u & 0xff; let idx = (u >> 8) as usize;
            if op == OP_ACCEPT {
                if !cqueue::more(flags) { pend.push(opcode::AcceptMulti::new(types::Fd(lfd)).build().user_data(ud(0, OP_ACCEPT))); }
                if res < 0 { continue; }
                let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
                let one: i32 = 1;
                for fd in [res, s] { unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, &one as *const i32 as *const _, 4); } }
                let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                sin.sin_family = libc::AF_INET as u16; sin.sin_port = t4.port().to_be(); sin.sin_addr.s_addr = u32::from(*t4.ip()).to_be();
                let c = Box::new(Conn { fd: [res, s], buf: [vec![0u8; BUF].into(), vec![0u8; BUF].into()], len: [0; 2], off: [0; 2], ops: 1, dead: false, addr: sin });
                let i = match free.pop() { Some(i) => { conns[i] = Some(c); i } None => { conns.push(Some(c)); conns.len() - 1 } };
                let c = conns[i].as_ref().unwrap();
                pend.push(opcode::Connect::new(types::Fd(s), &c.addr as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_in>() as u32).build().user_data(ud(i, OP_CONNECT)));
                continue;
            }
            let Some(c) = conns[idx].as_mut() else { continue };
            c.ops -= 1;
            if op == OP_CONNECT {
                if res < 0 { c.dead = true; } else {
                    for d in 0..2 { c.ops += 1; pend.push(opcode::Recv::new(types::Fd(c.fd[d]), c.buf[d].as_mut_ptr(), BUF as u32).build().user_data(ud(idx, OP_RECV + d as u64))); }
                }
            } else if op == OP_RECV || op == OP_RECV + 1 {
                let d = (op - OP_RECV) as usize;
                if res <= 0 || c.dead { c.dead = true; } else {
                    c.len[d] = res as usize; c.off[d] = 0; c.ops += 1;
                    pend.push(opcode::Send::new(types::Fd(c.fd[1 - d]), c.buf[d].as_ptr(), res as u32).build().user_data(ud(idx, OP_SEND + d as u64)));
                }
            } else {
                let d = (op - OP_SEND) as usize;
                if res < 0 || c.dead { c.dead = true; } else {
                    c.off[d] += res as usize; c.ops += 1;
                    if c.off[d] < c.len[d] {
                        pend.push(opcode::Send::new(types::Fd(c.fd[1 - d]), c.buf[d][c.off[d]..].as_ptr(), (c.len[d] - c.off[d]) as u32).build().user_data(ud(idx, OP_SEND + d as u64)));
                    } else {
                        pend.push(opcode::Recv::new(types::Fd(c.fd[d]), c.buf[d].as_mut_ptr(), BUF as u32).build().user_data(ud(idx, OP_RECV + d as u64)));
                    }
                }
            }
            if c.dead {
                unsafe { libc::shutdown(c.fd[0], libc::SHUT_RDWR); libc::shutdown(c.fd[1], libc::SHUT_RDWR); }
                if c.ops == 0 {
                    unsafe { libc::close(c.fd[0]); libc::close(c.fd[1]); }
                    conns[idx] = None; free.push(idx);
                }
            }
        }
        let _ = lfd.as_raw_fd();
    }
}
