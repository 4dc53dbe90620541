//! In-kernel forwarding's system calls: three BPF maps, one stream verdict program built
//! here from its instructions, and the socket facts the forwarder reads (SO_COOKIE,
//! TCP_INFO). No crate offers these for tokio's sockets without a C toolchain or a BPF
//! linker; the program is twenty-odd instructions, so it is written out below, each with
//! what it does, and the verifier checks it at start.
//!
//! The maps:
//! - `socks`, a SOCKHASH: the forwarded sockets, keyed by their cookie.
//! - `index`, a HASH: socket cookie to slot number.
//! - `slots`, an ARRAY mapped into this process (BPF_F_MMAPABLE): per socket, its peer's
//!   cookie, the gate, and the bytes the program passed up and redirected. The proxy reads
//!   and writes a slot with atomics, without a system call.
//!
//! The program, run by the kernel for every piece of data arriving on a forwarded socket:
//! ```text
//! slot = slots[index[cookie(skb)]]                   (none, or another socket's: pass up)
//! if skb.len == 0: drop                              (an end of stream: see below)
//! if slot.gate == slot.passed and slot.redirected + skb.len <= slot.limit
//!         and redirect(skb, socks[slot.peer]) succeeded:
//!     slot.redirected += skb.len                     (the data leaves on the peer)
//! else:
//!     slot.passed += skb.len                         (the proxy reads it, as without BPF)
//! ```
//! An end of stream arrives as an empty piece. The socket's reader sees it anyway (the
//! socket is shut for reading), and an empty piece must stay out of the socket map's
//! queues: the kernel takes a send or a delivery of 0 bytes there for a broken pipe and
//! stops the socket's forwarding, dropping what is queued behind it. So it is dropped.
//!
//! The gate is how the proxy keeps order: data passed up is redirected again only once the
//! proxy has written everything passed so far to the peer and said so (gate = passed);
//! a gate of `u64::MAX` passes everything up (the tunnel left the kernel path). The limit
//! bounds what the program may queue on the peer before the proxy has seen it sent: the
//! kernel does not hold a fast sender back for a slow receiver on its own.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;

/// One forwarded socket's slot, shared with the program (layout fixed: see `program`).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct Cells {
    /// The peer's cookie (its key in `socks`).
    pub(crate) peer: AtomicU64,
    /// Data is redirected while this equals `passed`.
    pub(crate) gate: AtomicU64,
    /// Bytes passed up to the socket's reader.
    pub(crate) passed: AtomicU64,
    /// Bytes redirected to the peer.
    pub(crate) redirected: AtomicU64,
    /// Data is redirected only while `redirected` stays within this; past it, passed up.
    pub(crate) limit: AtomicU64,
    /// The cookie of the socket the slot is for: a program run that looked the slot up
    /// before it was freed and given to another socket passes its data up instead.
    pub(crate) owner: AtomicU64,
}

const CELLS: usize = std::mem::size_of::<Cells>();

/// The maps and the attached program of one process.
pub(crate) struct Maps {
    socks: OwnedFd,
    index: OwnedFd,
    _slots: OwnedFd,
    _prog: OwnedFd,
    /// The slots' mapping: `capacity` `Cells`, page-aligned.
    mem: *mut Cells,
    len: usize,
    capacity: u32,
}

// SAFETY: `mem` points at a shared mapping that lives as long as `Maps` (unmapped in
// Drop) and is only ever accessed through the atomics of `Cells`, from any thread.
unsafe impl Send for Maps {}
// SAFETY: as above: every access through a shared reference is atomic.
unsafe impl Sync for Maps {}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;

const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_SOCKHASH: u32 = 18;
const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_PROG_TYPE_SK_SKB: u32 = 14;
const BPF_SK_SKB_STREAM_VERDICT: u32 = 5;

/// The `bpf(2)` attribute union is 128 bytes here (larger than any command used); unused
/// bytes must be zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32_at(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64_at(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: bpf(2) with a pointer to a zero-padded attribute block of the size passed;
    // every pointer inside it (keys, values, instructions, the log) points at memory the
    // caller keeps alive and sized for the duration of the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), std::mem::size_of::<Attr>())
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn fd_of(rc: libc::c_long) -> io::Result<OwnedFd> {
    let fd = i32::try_from(rc).map_err(|_| io::Error::other("bpf returned no descriptor"))?;
    // SAFETY: a successful map or program creation returns a new descriptor that nothing
    // else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn map_create(kind: u32, key: u32, value: u32, entries: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32_at(0, kind).u32_at(4, key).u32_at(8, value).u32_at(12, entries).u32_at(16, flags);
    fd_of(bpf(BPF_MAP_CREATE, &mut a)?)
}

fn map_update(map: &OwnedFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut a = Attr::new();
    a.u32_at(0, map.as_raw_fd() as u32)
        .u64_at(8, key.as_ptr() as u64)
        .u64_at(16, value.as_ptr() as u64)
        .u64_at(24, 0); // BPF_ANY
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
}

fn map_delete(map: &OwnedFd, key: &[u8]) -> io::Result<()> {
    let mut a = Attr::new();
    a.u32_at(0, map.as_raw_fd() as u32).u64_at(8, key.as_ptr() as u64);
    bpf(BPF_MAP_DELETE_ELEM, &mut a).map(drop)
}

impl Maps {
    /// Creates the maps for `capacity` sockets, loads the program and attaches it to the
    /// socket map. Fails without CAP_BPF and CAP_NET_ADMIN (or root), on a kernel without
    /// sockmap or mappable arrays (before 5.5), or when the verifier refuses the program
    /// (its log is in the error).
    pub(crate) fn new(capacity: u32) -> io::Result<Maps> {
        // The instructions and TCP_INFO are read as little-endian.
        if cfg!(target_endian = "big") {
            return Err(io::Error::other("in-kernel forwarding is built for little-endian CPUs"));
        }
        let capacity = capacity.max(2);
        let socks = map_create(BPF_MAP_TYPE_SOCKHASH, 8, 8, capacity, 0)?;
        let index = map_create(BPF_MAP_TYPE_HASH, 8, 4, capacity, 0)?;
        let slots = map_create(BPF_MAP_TYPE_ARRAY, 4, CELLS as u32, capacity, BPF_F_MMAPABLE)?;
        let page = 4096usize;
        let len = (capacity as usize * CELLS).div_ceil(page) * page;
        // SAFETY: maps `len` bytes of the array's values (the kernel rounds the array to
        // pages, and `len` is at most that), shared with the kernel; unmapped in Drop.
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                slots.as_raw_fd(),
                0,
            )
        };
        if mem == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let unmap = |e: io::Error| {
            // SAFETY: the mapping made just above, not used after this.
            unsafe { libc::munmap(mem, len) };
            e
        };
        let insns = program(index.as_raw_fd(), slots.as_raw_fd(), socks.as_raw_fd());
        let prog = load(&insns).map_err(unmap)?;
        let mut a = Attr::new();
        a.u32_at(0, socks.as_raw_fd() as u32)
            .u32_at(4, prog.as_raw_fd() as u32)
            .u32_at(8, BPF_SK_SKB_STREAM_VERDICT);
        bpf(BPF_PROG_ATTACH, &mut a).map_err(unmap)?;
        Ok(Maps { socks, index, _slots: slots, _prog: prog, mem: mem.cast(), len, capacity })
    }

    /// How many sockets the maps hold at most.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slot `i` (`i < capacity`).
    pub(crate) fn cells(&self, i: u32) -> &Cells {
        assert!(i < self.capacity, "slot {i} beyond {}", self.capacity);
        // SAFETY: within the mapping (i < capacity, and the mapping holds capacity
        // slots), aligned (page-aligned base, 48-byte slots), and only accessed through
        // atomics; the reference lives no longer than `self`, which keeps it mapped.
        unsafe { &*self.mem.add(i as usize) }
    }

    /// Puts `socket` under the program: its slot first (so that the program finds it from
    /// the first byte), then the socket itself.
    pub(crate) fn insert(&self, cookie: u64, slot: u32, socket: BorrowedFd<'_>) -> io::Result<()> {
        map_update(&self.index, &cookie.to_ne_bytes(), &slot.to_ne_bytes())?;
        let fd = u64::from(socket.as_raw_fd() as u32);
        map_update(&self.socks, &cookie.to_ne_bytes(), &fd.to_ne_bytes())
    }

    /// Forgets a socket's slot (the socket left `socks` when it was closed, or is about
    /// to be).
    pub(crate) fn forget(&self, cookie: u64) {
        let _ = map_delete(&self.socks, &cookie.to_ne_bytes());
        let _ = map_delete(&self.index, &cookie.to_ne_bytes());
    }
}

impl Drop for Maps {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no `Cells` reference outlives `self`.
        unsafe { libc::munmap(self.mem.cast(), self.len) };
    }
}

/// Loads the program; on refusal, the verifier's log goes into the error.
fn load(insns: &[u64]) -> io::Result<OwnedFd> {
    let license = b"Dual MIT/GPL\0";
    let attempt = |log: &mut Vec<u8>| {
        let mut a = Attr::new();
        a.u32_at(0, BPF_PROG_TYPE_SK_SKB)
            .u32_at(4, insns.len() as u32)
            .u64_at(8, insns.as_ptr() as u64)
            .u64_at(16, license.as_ptr() as u64);
        if !log.is_empty() {
            a.u32_at(24, 1).u32_at(28, log.len() as u32).u64_at(32, log.as_mut_ptr() as u64);
        }
        a.0[48..48 + 7].copy_from_slice(b"rustle\0");
        bpf(BPF_PROG_LOAD, &mut a)
    };
    match attempt(&mut Vec::new()) {
        Ok(fd) => fd_of(fd),
        Err(e)
            if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            let mut log = vec![0u8; 64 * 1024];
            let _ = attempt(&mut log);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            Err(io::Error::new(e.kind(), format!("{e}; the verifier said: {}", text.trim())))
        }
        Err(e) => Err(e),
    }
}

/// The socket's cookie (SO_COOKIE): a number the kernel gives each socket, never reused
/// while the system runs.
pub(crate) fn socket_cookie(socket: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt on a descriptor kept open by the borrow, writing at most `len`
    // bytes into `cookie`, which is exactly that large.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(cookie)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Has the kernel look at the socket's send queue again: re-setting TCP_NOTSENT_LOWAT (to
/// what it is) runs the socket's write-space callback, which restarts a socket map's
/// queue for the socket. That queue retries a send the socket had no room for only when
/// the socket says it has room again, which TCP says only to a writer that found it
/// full: not to the kernel's queue, whose data could otherwise wait for ever.
pub(crate) fn kick_writer(socket: BorrowedFd<'_>) -> io::Result<()> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt on a descriptor kept open by the borrow, writing at most `len`
    // bytes into `value`, which is exactly that large.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    super::set_int(&socket, libc::SOL_TCP, libc::TCP_NOTSENT_LOWAT, value)
}

/// A TCP socket's facts the forwarder reads: its state (`TCP_ESTABLISHED` is 1) and the
/// bytes acknowledged by its peer.
fn tcp_info(socket: BorrowedFd<'_>) -> io::Result<(u8, u64)> {
    // struct tcp_info up to tcpi_bytes_acked (Linux 4.1): the state is its first byte,
    // tcpi_bytes_acked the u64 at 120.
    let mut info = [0u64; 16];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: getsockopt on a descriptor kept open by the borrow, writing at most `len`
    // bytes into `info`, which is exactly that large.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < 128 {
        return Err(io::Error::other("TCP_INFO without tcpi_bytes_acked (Linux before 4.1)"));
    }
    Ok(((info[0] & 0xff) as u8, info[15]))
}

/// Whether the TCP socket is established (a socket map takes no other).
pub(crate) fn tcp_established(socket: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(tcp_info(socket)?.0 == 1)
}

/// Bytes written into a TCP socket's stream so far, counted from an origin of the
/// kernel's (compare two readings): those its peer acknowledged plus those still queued
/// (SIOCOUTQ), read until no acknowledgement came between the two readings, so the sum is
/// exact. After its FIN the figure counts the FIN.
pub(crate) fn tcp_written(socket: BorrowedFd<'_>) -> io::Result<u64> {
    let mut acked = tcp_info(socket)?.1;
    for _ in 0..64 {
        let mut queued: libc::c_int = 0;
        // SAFETY: ioctl SIOCOUTQ (TIOCOUTQ) on a descriptor kept open by the borrow,
        // writing one int into `queued`.
        let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let again = tcp_info(socket)?.1;
        if again == acked {
            return Ok(acked + u64::from(queued.max(0) as u32));
        }
        acked = again;
    }
    Err(io::Error::other("the send queue moved on every look"))
}

// Instruction encoding (one u64 each, little-endian: opcode, registers, offset, immediate).
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | u64::from(dst & 0xf) << 8
        | u64::from(src & 0xf) << 12
        | u64::from(off as u16) << 16
        | u64::from(imm as u32) << 32
}

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const R10: u8 = 10;

fn mov_reg(dst: u8, src: u8) -> u64 {
    insn(0xbf, dst, src, 0, 0)
}
fn mov_imm(dst: u8, imm: i32) -> u64 {
    insn(0xb7, dst, 0, 0, imm)
}
fn add_imm(dst: u8, imm: i32) -> u64 {
    insn(0x07, dst, 0, 0, imm)
}
fn load64(dst: u8, src: u8, off: i16) -> u64 {
    insn(0x79, dst, src, off, 0)
}
fn load32(dst: u8, src: u8, off: i16) -> u64 {
    insn(0x61, dst, src, off, 0)
}
fn store64(dst: u8, off: i16, src: u8) -> u64 {
    insn(0x7b, dst, src, off, 0)
}
fn store32(dst: u8, off: i16, src: u8) -> u64 {
    insn(0x63, dst, src, off, 0)
}
/// `lock *(u64 *)(dst + off) += src`
fn atomic_add64(dst: u8, off: i16, src: u8) -> u64 {
    insn(0xdb, dst, src, off, 0)
}
fn call(helper: i32) -> u64 {
    insn(0x85, 0, 0, 0, helper)
}
fn exit() -> u64 {
    insn(0x95, 0, 0, 0, 0)
}
fn jeq_imm(dst: u8, imm: i32, off: i16) -> u64 {
    insn(0x15, dst, 0, off, imm)
}
fn jne_imm(dst: u8, imm: i32, off: i16) -> u64 {
    insn(0x55, dst, 0, off, imm)
}
fn jne_reg(dst: u8, src: u8, off: i16) -> u64 {
    insn(0x5d, dst, src, off, 0)
}
/// A map's descriptor into `dst` (two instructions; BPF_PSEUDO_MAP_FD).
fn load_map(dst: u8, fd: i32) -> [u64; 2] {
    [insn(0x18, dst, 1, 0, fd), 0]
}

const MAP_LOOKUP_ELEM: i32 = 1;
const GET_SOCKET_COOKIE: i32 = 46;
const SK_REDIRECT_HASH: i32 = 72;
const SK_PASS: i32 = 1;
const SK_DROP: i32 = 0;

/// The stream verdict program (see the module's text), for the maps with these
/// descriptors. Offsets into a slot follow `Cells`.
fn program(index: i32, slots: i32, socks: i32) -> Vec<u64> {
    let mut p = Vec::with_capacity(40);
    p.push(mov_reg(R6, R1)); // r6 = skb
    p.push(call(GET_SOCKET_COOKIE)); // r0 = cookie(skb)
    p.push(mov_reg(R9, R0)); // r9 = cookie
    p.push(store64(R10, -8, R0)); // key at fp-8
    p.extend(load_map(R1, index));
    p.push(mov_reg(R2, R10));
    p.push(add_imm(R2, -8));
    p.push(call(MAP_LOOKUP_ELEM)); // r0 = &index[cookie]
    let to_pass_1 = p.len();
    p.push(0); // if r0 == 0 goto pass (patched)
    p.push(load32(R1, R0, 0)); // r1 = slot number
    p.push(store32(R10, -12, R1));
    p.extend(load_map(R1, slots));
    p.push(mov_reg(R2, R10));
    p.push(add_imm(R2, -12));
    p.push(call(MAP_LOOKUP_ELEM)); // r0 = &slots[slot]
    let to_pass_2 = p.len();
    p.push(0); // if r0 == 0 goto pass (patched)
    p.push(mov_reg(R7, R0)); // r7 = slot
    p.push(load64(R1, R7, 40)); // r1 = owner
    let to_pass_4 = p.len();
    p.push(0); // if owner != cookie goto pass (patched)
    p.push(load32(R8, R6, 0)); // r8 = skb->len
    let to_pass_3 = p.len();
    p.push(0); // if len == 0 goto drop (an end of stream, see below)
    p.push(load64(R1, R7, 8)); // r1 = gate
    p.push(load64(R2, R7, 16)); // r2 = passed
    let to_count_1 = p.len();
    p.push(0); // if gate != passed goto count_pass (patched)
    p.push(load64(R1, R7, 24)); // r1 = redirected
    p.push(insn(0x0f, R1, R8, 0, 0)); // r1 += len
    p.push(load64(R2, R7, 32)); // r2 = limit
    let to_count_3 = p.len();
    p.push(0); // if redirected + len > limit goto count_pass (patched)
    p.push(load64(R1, R7, 0)); // peer cookie
    p.push(store64(R10, -24, R1));
    p.push(mov_reg(R1, R6));
    p.extend(load_map(R2, socks));
    p.push(mov_reg(R3, R10));
    p.push(add_imm(R3, -24));
    p.push(mov_imm(R4, 0)); // the peer's egress
    p.push(call(SK_REDIRECT_HASH));
    let to_count_2 = p.len();
    p.push(0); // if r0 != SK_PASS goto count_pass (patched)
    p.push(atomic_add64(R7, 24, R8)); // redirected += len
    p.push(mov_imm(R0, SK_PASS));
    p.push(exit());
    let count_pass = p.len();
    p.push(atomic_add64(R7, 16, R8)); // passed += len
    let pass = p.len();
    p.push(mov_imm(R0, SK_PASS));
    p.push(exit());
    let drop = p.len();
    p.push(mov_imm(R0, SK_DROP));
    p.push(exit());
    let rel = |from: usize, to: usize| (to - from - 1) as i16;
    p[to_pass_1] = jeq_imm(R0, 0, rel(to_pass_1, pass));
    p[to_pass_2] = jeq_imm(R0, 0, rel(to_pass_2, pass));
    p[to_pass_3] = jeq_imm(R8, 0, rel(to_pass_3, drop));
    p[to_pass_4] = jne_reg(R1, R9, rel(to_pass_4, pass));
    p[to_count_1] = jne_reg(R1, R2, rel(to_count_1, count_pass));
    p[to_count_2] = jne_imm(R0, SK_PASS, rel(to_count_2, count_pass));
    p[to_count_3] = insn(0x2d, R1, R2, rel(to_count_3, count_pass), 0); // jgt r1, r2
    p
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Whether a descriptor has something to say (readable, an end of stream).
    fn readable(s: &TcpStream) -> bool {
        let mut fds = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll on one valid pollfd, without waiting.
        unsafe { libc::poll(&mut fds, 1, 0) == 1 }
    }

    /// The program forwards each way, counts exactly, runs over data queued before the
    /// sockets entered the map once the mark is lowered, wakes nobody for what it
    /// redirects, passes up past the limit, and leaves an end of stream to the reader.
    #[test]
    fn the_program_forwards_counts_and_passes_up() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let maps = match Maps::new(64) {
            Ok(m) => m,
            // Root can: CI runs as root, where this is a failure.
            Err(e) if !root => return eprintln!("no BPF here: {e}"),
            Err(e) => panic!("root cannot make the maps: {e}"),
        };
        // client <-> (pa) proxy (pb) <-> server
        let (mut client, mut pa) = pair();
        let (pb, mut server) = pair();
        client.write_all(b"early").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let (ca, cb) = (socket_cookie(pa.as_fd()).unwrap(), socket_cookie(pb.as_fd()).unwrap());
        for (slot, peer) in [(0, cb), (1, ca)] {
            let c = maps.cells(slot);
            c.peer.store(peer, Ordering::SeqCst);
            c.gate.store(0, Ordering::SeqCst);
            c.passed.store(0, Ordering::SeqCst);
            c.redirected.store(0, Ordering::SeqCst);
            c.limit.store(1 << 20, Ordering::SeqCst);
        }
        maps.cells(0).owner.store(ca, Ordering::SeqCst);
        maps.cells(1).owner.store(cb, Ordering::SeqCst);
        let w0 = tcp_written(pb.as_fd()).unwrap();
        maps.insert(ca, 0, pa.as_fd()).unwrap();
        maps.insert(cb, 1, pb.as_fd()).unwrap();
        crate::io::sys::set_rcvlowat(&pa, 1).unwrap();
        crate::io::sys::set_rcvlowat(&pb, 1).unwrap();
        let mut buf = [0u8; 5];
        server.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"early");
        client.write_all(b"hello").unwrap();
        server.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        server.write_all(b"world").unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"world");
        assert!(!readable(&pa) && !readable(&pb), "redirected data woke the proxy's sockets");
        assert_eq!(maps.cells(0).redirected.load(Ordering::SeqCst), 10);
        assert_eq!(maps.cells(1).redirected.load(Ordering::SeqCst), 5);
        assert_eq!(tcp_written(pb.as_fd()).unwrap() - w0, 10);
        // Past the limit: passed up to the proxy's socket, and nothing more redirected.
        maps.cells(0).limit.store(12, Ordering::SeqCst);
        client.write_all(b"over").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(readable(&pa), "passed-up data is readable");
        let mut over = [0u8; 4];
        pa.read_exact(&mut over).unwrap();
        assert_eq!(&over, b"over");
        assert_eq!(maps.cells(0).passed.load(Ordering::SeqCst), 4);
        assert_eq!(maps.cells(0).redirected.load(Ordering::SeqCst), 10);
        // End of stream from the client: the proxy's socket reads 0.
        client.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        pa.set_nonblocking(true).unwrap();
        assert_eq!(pa.read(&mut [0u8; 16]).unwrap(), 0);
        maps.forget(ca);
        maps.forget(cb);
    }
}
