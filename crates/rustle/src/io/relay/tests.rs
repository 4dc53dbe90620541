//! The relay engine against real loopback sockets: integrity in every splice mode, mode
//! switches, half-close, resets, backpressure, the idle timer, and the size of the
//! futures that every open connection keeps alive.

use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// Two connected pairs: (client, proxy's client side) and (proxy's upstream side, origin).
async fn pairs() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let client = TcpStream::connect(addr).await.expect("connect");
    let (proxy_client, _) = l.accept().await.expect("accept");
    let proxy_up = TcpStream::connect(addr).await.expect("connect");
    let (origin, _) = l.accept().await.expect("accept");
    (client, proxy_client, proxy_up, origin)
}

fn opts(splice: SpliceMode) -> Opts {
    Opts { idle: Duration::from_secs(10), splice, grace: None }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ seed).collect()
}

async fn send_and_finish(mut s: tokio::net::tcp::OwnedWriteHalf, data: Vec<u8>) {
    s.write_all(&data).await.expect("write");
    s.shutdown().await.expect("shutdown");
}

async fn read_all(mut s: tokio::net::tcp::OwnedReadHalf) -> Vec<u8> {
    let mut v = Vec::new();
    s.read_to_end(&mut v).await.expect("read");
    v
}

#[tokio::test]
async fn bulk_both_ways_arrives_intact_in_every_mode() {
    for mode in [SpliceMode::Never, SpliceMode::Auto, SpliceMode::Always] {
        let (client, pc, pu, origin) = pairs().await;
        let up_data = pattern(3 << 20, 1);
        let down_data = pattern(12 << 20, 2);
        let (cr, cw) = client.into_split();
        let (or, ow) = origin.into_split();
        let relay = run(&pc, &pu, b"early-up:", b"", opts(mode));
        let (r, _, got_down, _, got_up) = tokio::join!(
            relay,
            send_and_finish(cw, up_data.clone()),
            read_all(cr),
            send_and_finish(ow, down_data.clone()),
            read_all(or),
        );
        let (totals, result) = r;
        result.expect("relay ends cleanly");
        let mut want_up = b"early-up:".to_vec();
        want_up.extend_from_slice(&up_data);
        assert_eq!(Sha256::digest(&got_up), Sha256::digest(&want_up), "{mode:?} up");
        assert_eq!(Sha256::digest(&got_down), Sha256::digest(&down_data), "{mode:?} down");
        assert_eq!(totals.up, want_up.len() as u64);
        assert_eq!(totals.down, down_data.len() as u64);
        // Pipes come back to the pool empty, buffers are not held.
        assert!(idle_pipes() <= 64);
    }
}

#[tokio::test]
async fn auto_mode_switches_to_splice_and_back() {
    let (mut client, pc, pu, mut origin) = pairs().await;
    // This thread's relays only (the runtime is this test's own): other tests relaying at
    // the same time count on their own threads.
    let before = mode_switches();
    let relay = run(&pc, &pu, b"", b"", opts(SpliceMode::Auto));
    let script = async {
        let mut got = vec![0u8; 4 << 20];
        for round in 0..2u8 {
            // Bulk: reads fill the buffer, the direction starts splicing.
            let bulk = pattern(4 << 20, round);
            let (w, r) = tokio::join!(origin.write_all(&bulk), client.read_exact(&mut got));
            w.expect("write");
            r.expect("read");
            assert_eq!(got, bulk);
            // Small messages one at a time: small reads, back to copying.
            for i in 0..6u8 {
                origin.write_all(&[i; 100]).await.expect("write");
                let mut small = [0u8; 100];
                client.read_exact(&mut small).await.expect("read");
                assert_eq!(small, [i; 100]);
            }
        }
        drop(client);
        drop(origin);
    };
    let (r, ()) = tokio::join!(relay, script);
    let _ = r;
    let after = mode_switches();
    assert!(after.0 - before.0 >= 2, "switched to splice twice: {before:?} -> {after:?}");
    assert!(after.1 - before.1 >= 2, "switched back to copy twice: {before:?} -> {after:?}");
}

#[tokio::test]
async fn half_close_delivers_the_rest_and_keeps_the_other_way_open() {
    for mode in [SpliceMode::Never, SpliceMode::Always] {
        let (client, pc, pu, origin) = pairs().await;
        let (mut cr, mut cw) = client.into_split();
        let (mut or, ow) = origin.into_split();
        let answer = pattern(2 << 20, 7);
        let relay = run(&pc, &pu, b"", b"", opts(mode));
        let script = async {
            // The origin answers everything and closes its side at once...
            send_and_finish(ow, answer.clone()).await;
            let mut got = Vec::new();
            cr.read_to_end(&mut got).await.expect("read");
            assert_eq!(got.len(), answer.len(), "{mode:?}: the whole answer then EOF");
            assert_eq!(got, answer);
            // ...and the client can still talk to it.
            cw.write_all(b"still here").await.expect("write");
            cw.shutdown().await.expect("shutdown");
            let mut rest = Vec::new();
            or.read_to_end(&mut rest).await.expect("read");
            assert_eq!(rest, b"still here");
        };
        let ((_, result), ()) = tokio::join!(relay, script);
        result.expect("clean end");
    }
}

#[tokio::test]
async fn a_reset_ends_both_directions() {
    for mode in [SpliceMode::Never, SpliceMode::Always] {
        reset_in_mode(mode).await;
    }
}

async fn reset_in_mode(mode: SpliceMode) {
    let (mut client, pc, pu, mut origin) = pairs().await;
    // As in the proxy, the sockets close when the relay returns.
    let relay = async {
        let r = run(&pc, &pu, b"", b"", opts(mode)).await;
        drop((pc, pu));
        r
    };
    let script = async {
        origin.write_all(&pattern(1 << 20, 3)).await.expect("write");
        let mut first = vec![0u8; 1 << 20];
        client.read_exact(&mut first).await.expect("read");
        // Abort: RST instead of FIN.
        socket2::SockRef::from(&origin).set_linger(Some(Duration::ZERO)).expect("linger");
        drop(origin);
        let mut rest = Vec::new();
        // The client sees the end promptly (EOF or reset), not a hang.
        let end = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest)).await;
        assert!(end.is_ok(), "client connection closed after the origin's reset");
    };
    let ((_, result), ()) = tokio::join!(relay, script);
    assert!(result.is_err(), "{mode:?}: a reset is an error, logged once: {result:?}");
}

#[tokio::test]
async fn a_client_that_never_reads_stops_the_reading() {
    let (_client, pc, pu, mut origin) = pairs().await;
    let relay = run(&pc, &pu, b"", b"", opts(SpliceMode::Auto));
    let flood = async {
        let chunk = vec![0u8; 64 * 1024];
        let mut sent = 0usize;
        loop {
            match tokio::time::timeout(Duration::from_millis(500), origin.write_all(&chunk)).await {
                Ok(Ok(())) => sent += chunk.len(),
                _ => break sent,
            }
            if sent > 256 << 20 {
                break sent;
            }
        }
    };
    tokio::select! {
        _ = relay => panic!("the relay ended"),
        sent = flood => {
            // Socket buffers on both sides plus one pipe or one parked buffer: a few MB,
            // not an unbounded amount held by the proxy.
            assert!(sent < 64 << 20, "origin could push {sent} bytes into a stalled relay");
        }
    }
}

#[tokio::test]
async fn a_splice_moves_what_the_pipe_takes() {
    // One splice into the pipe takes what the pipe has room for, not the scratch buffer's
    // 16 KiB as a copy would: capped so, a bulk transfer would cost a splice pair per 16 KiB.
    let (client, pc, pu, origin) = pairs().await;
    let data = pattern(32 << 20, 4);
    let (cr, cw) = client.into_split();
    let (or, ow) = origin.into_split();
    let (calls0, bytes0) = splice_reads();
    let relay = run(&pc, &pu, b"", b"", opts(SpliceMode::Always));
    let ((_, result), (), got, (), _) = tokio::join!(
        relay,
        send_and_finish(cw, Vec::new()),
        read_all(cr),
        send_and_finish(ow, data.clone()),
        read_all(or),
    );
    result.expect("clean end");
    assert_eq!(Sha256::digest(&got), Sha256::digest(&data));
    let (calls, bytes) = splice_reads();
    let (calls, bytes) = (calls - calls0, bytes - bytes0);
    assert_eq!(bytes, data.len() as u64, "every byte went through the pipe");
    assert!(bytes / calls > SCRATCH as u64, "{calls} splices moved {bytes} bytes");
}

#[tokio::test]
async fn a_short_splice_is_not_mistaken_for_an_empty_socket() {
    // A pipe has a slot per fragment: with many small segments queued, one splice moves
    // far less than the pipe's size although the socket holds more. If that were taken
    // for "drained", nothing would wake the relay for the rest (the sender has finished).
    let (mut client, pc, pu, mut origin) = pairs().await;
    origin.set_nodelay(true).expect("nodelay");
    socket2::SockRef::from(&pu).set_recv_buffer_size(8 << 20).expect("rcvbuf");
    let piece = pattern(1000, 7);
    // A write to another socket between two pieces keeps them from sharing a page
    // fragment (the kernel would merge contiguous ones into one fragment).
    let (mut other, _other_peer, _, _) = pairs().await;
    for _ in 0..1200 {
        origin.write_all(&piece).await.expect("write");
        other.write_all(&piece[..10]).await.expect("write");
    }
    // Everything written is queued at the relay's socket before the relay starts (at once
    // on loopback, unless the receive buffer is smaller than 1.2 MB: net.core.rmem_max
    // under ~2 MB caps the 8 MB asked. Then what fits is queued, which still has many
    // fragments; the wait gives up after 2 s and the test goes on with that).
    let mut peeked = vec![0u8; 1200 * 1000];
    let all_queued = async {
        while pu.peek(&mut peeked).await.expect("peek") < peeked.len() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), all_queued).await;
    let relay = run(&pc, &pu, b"", b"", opts(SpliceMode::Always));
    let read = async {
        let mut got = vec![0u8; 1200 * 1000];
        let r = tokio::time::timeout(Duration::from_secs(3), client.read_exact(&mut got)).await;
        r.expect("everything queued arrives without more data behind it").expect("read");
        assert!(got.chunks(1000).all(|c| c == piece.as_slice()));
        drop(client);
        drop(origin);
    };
    let ((_, _), ()) = tokio::join!(relay, read);
}

#[tokio::test]
async fn grace_while_splicing_still_delivers_a_small_tail_soon() {
    // With a grace delay, a splicing direction is woken only once 256 KiB are queued, or
    // after the delay: a small message after a bulk transfer comes through after the
    // delay, not never.
    let (mut client, pc, pu, mut origin) = pairs().await;
    let o = Opts {
        idle: Duration::from_secs(10),
        splice: SpliceMode::Always,
        grace: Some(Grace { reads: 2, delay: Duration::from_millis(5) }),
    };
    let relay = run(&pc, &pu, b"", b"", o);
    let script = async {
        let bulk = pattern(4 << 20, 5);
        let mut got = vec![0u8; bulk.len()];
        let (w, r) = tokio::join!(client.write_all(&bulk), origin.read_exact(&mut got));
        w.expect("write");
        r.expect("read");
        assert_eq!(Sha256::digest(&got), Sha256::digest(&bulk));
        for round in 0..5u8 {
            let msg = pattern(1000, round);
            client.write_all(&msg).await.expect("write");
            let mut back = vec![0u8; msg.len()];
            let read = origin.read_exact(&mut back);
            tokio::time::timeout(Duration::from_secs(2), read)
                .await
                .expect("a small message is not held back")
                .expect("read");
            assert_eq!(back, msg);
        }
        drop(client);
        drop(origin);
    };
    let ((_, result), ()) = tokio::join!(relay, script);
    // The relay ends when the sockets go; how (clean or reset) does not matter here.
    let _ = result;
}

#[tokio::test(start_paused = true)]
async fn silence_both_ways_ends_the_relay() {
    // Paused time: the relay's idle timer runs on tokio's clock, which jumps to it.
    let (_client, pc, pu, _origin) = pairs().await;
    let o = Opts { idle: Duration::from_secs(30), splice: SpliceMode::Auto, grace: None };
    let start = tokio::time::Instant::now();
    let (_, result) = run(&pc, &pu, b"", b"", o).await;
    assert!(matches!(result, Err(Error::Timeout(Phase::TunnelIdle))), "{result:?}");
    let took = start.elapsed();
    assert!(took >= Duration::from_secs(30), "ended after {took:?}, before the idle time");
    assert!(took < Duration::from_secs(31), "ended after {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_byte_moves_the_idle_deadline() {
    let (mut client, pc, pu, mut origin) = pairs().await;
    let o = Opts { idle: Duration::from_secs(30), splice: SpliceMode::Auto, grace: None };
    let start = tokio::time::Instant::now();
    let relay = run(&pc, &pu, b"", b"", o);
    let talk = async {
        tokio::time::sleep(Duration::from_secs(20)).await;
        client.write_all(b"x").await.expect("write");
        let mut b = [0u8; 1];
        origin.read_exact(&mut b).await.expect("read");
        tokio::time::Instant::now()
    };
    let ((totals, result), sent) = tokio::join!(relay, talk);
    assert!(matches!(result, Err(Error::Timeout(Phase::TunnelIdle))), "{result:?}");
    assert_eq!((totals.up, totals.down), (1, 0));
    let quiet = sent.elapsed();
    assert!(sent - start >= Duration::from_secs(20));
    assert!(quiet >= Duration::from_secs(30), "ended {quiet:?} after the last byte");
    assert!(quiet < Duration::from_secs(31), "ended {quiet:?} after the last byte");
}

#[tokio::test(start_paused = true)]
async fn an_idle_relay_parks_and_resumes_where_it_stopped() {
    let (mut client, pc, pu, mut origin) = pairs().await;
    let o = Opts { idle: Duration::from_secs(60), splice: SpliceMode::Auto, grace: None };
    let mut relay = run(pc, pu, b"", b"", o).closing().parking();
    let start = tokio::time::Instant::now();
    let ended = std::future::poll_fn(|cx| relay.poll_ended(cx));
    let talk = async {
        client.write_all(b"hello").await.expect("write");
        let mut b = [0u8; 5];
        origin.read_exact(&mut b).await.expect("read");
        b
    };
    let (ended, got) = tokio::join!(ended, talk);
    assert_eq!(&got, b"hello");
    assert!(matches!(ended, Ended::Idle), "a quiet relay says it can be parked");
    let quiet = start.elapsed();
    assert!(quiet >= PARK_AFTER && quiet < PARK_AFTER + Duration::from_millis(100), "{quiet:?}");

    let (c, u, resume) = relay.park().expect("parked");
    assert_eq!((resume.totals().up, resume.totals().down), (5, 0));
    assert_eq!(resume.done(), (false, false));
    // The idle timeout counts from the last byte, parked or not.
    let deadline = resume.deadline();
    assert!(deadline - start <= Duration::from_secs(60), "{:?}", deadline - start);
    tokio::time::sleep(Duration::from_secs(10)).await;

    let c = TcpStream::from_std(c).expect("client back");
    let u = TcpStream::from_std(u).expect("upstream back");
    let relay = Relay::resume(c, u, resume, false);
    let talk = async {
        origin.write_all(b"back").await.expect("write");
        let mut b = [0u8; 4];
        client.read_exact(&mut b).await.expect("read");
        (b, tokio::time::Instant::now())
    };
    let ((totals, result), (got, sent)) = tokio::join!(relay, talk);
    assert_eq!(&got, b"back");
    assert_eq!((totals.up, totals.down), (5, 4), "what it moved before parking counts");
    assert!(matches!(result, Err(Error::Timeout(Phase::TunnelIdle))), "{result:?}");
    let quiet = sent.elapsed();
    assert!(quiet >= Duration::from_secs(60) && quiet < Duration::from_secs(61), "{quiet:?}");
}

#[tokio::test]
async fn grace_delay_still_delivers_everything() {
    let (client, pc, pu, origin) = pairs().await;
    let o = Opts {
        idle: Duration::from_secs(10),
        splice: SpliceMode::Auto,
        grace: Some(Grace { reads: 2, delay: Duration::from_millis(5) }),
    };
    let (cr, cw) = client.into_split();
    let (or, ow) = origin.into_split();
    let msgs: Vec<u8> = pattern(50_000, 9);
    let relay = run(&pc, &pu, b"", b"", o);
    let write_slowly = async move {
        let mut w = cw;
        for chunk in msgs.chunks(500) {
            w.write_all(chunk).await.expect("write");
            // The scenario: a sender slower than the relay, so its reads stay small and
            // the grace delay comes into play.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        w.shutdown().await.expect("shutdown");
    };
    let ((_, result), (), got, (), _) = tokio::join!(
        relay,
        write_slowly,
        read_all(or),
        send_and_finish(ow, Vec::new()),
        read_all(cr)
    );
    result.expect("clean end");
    assert_eq!(got, pattern(50_000, 9));
}

/// Size of the future an async fn returns, without calling it.
fn future_size<F, A, B, C, D, R>(_: &F) -> usize
where
    F: Fn(A, B, C, D) -> R,
{
    std::mem::size_of::<R>()
}

fn future_size3<F, A, B, C, R>(_: &F) -> usize
where
    F: Fn(A, B, C) -> R,
{
    std::mem::size_of::<R>()
}

/// Every open connection is one of these futures: keep them small. The budgets are the
/// sizes the compiler gives them, plus a little room; a change that grows one past
/// its budget should say why. The sizes depend on the compiler's layout of async state
/// machines, so a rustc upgrade alone can break this test: its message says what to do.
#[test]
fn connection_futures_stay_within_budget() {
    let http = future_size(&crate::front::dispatch::serve_fresh);
    let socks = |g, l, s, p| crate::front::socks::serve(g, l, s, p, crate::io::buf::Buf::default());
    let socks = future_size(&socks);
    let relay_port = future_size(&crate::front::portmap::serve);
    let relay = std::mem::size_of::<Relay<TcpStream, TcpStream>>();
    let tunnel = future_size3(&crate::front::tunnel::socket_task);
    eprintln!(
        "future sizes: http1 {http}, socks {socks}, portmap {relay_port}, relay {relay}, \
         tunnel {tunnel}"
    );
    let over = |what: &str, size: usize, budget: usize| {
        format!(
            "{what} future is {size} bytes, over its budget of {budget}. The sizes are the \
             compiler's layout of async state machines: a rustc upgrade alone can move them. \
             If the code did not change, compare with the previous toolchain (rustup run \
             <version> cargo test); when only the compiler moved it, set the budget to the \
             new size plus a little room and name the rustc version in the commit; when a \
             change here grew it, box the new state or say in the budget's comment why it \
             must grow."
        )
    };
    assert!(relay <= RELAY_BUDGET, "{}", over("relay::run", relay, RELAY_BUDGET));
    assert!(tunnel <= TUNNEL_BUDGET, "{}", over("tunnel task", tunnel, TUNNEL_BUDGET));
    assert!(http <= HTTP_BUDGET, "{}", over("http1::serve", http, HTTP_BUDGET));
    assert!(socks <= SOCKS_BUDGET, "{}", over("socks::serve", socks, SOCKS_BUDGET));
    assert!(relay_port <= PORTMAP_BUDGET, "{}", over("portmap::serve", relay_port, PORTMAP_BUDGET));
}

/// An open tunnel is one tunnel task: the number that decides memory per tunnel. tokio
/// rounds a task to 128 bytes with 104 of its own (header 32, scheduler and id 16, stage
/// tag 8, trailer 48): up to 536 bytes of future the task takes 640 bytes, past that 768.
const TUNNEL_BUDGET: usize = 536;
const RELAY_BUDGET: usize = 352;
/// Connections still in a handshake or an HTTP exchange.
/// (HTTP grew by its TLS session, the plain-or-TLS stream and https:// origins when TLS
/// came, the handshakes themselves boxed; then by the origin connection it keeps.)
/// (Then shrank when the connection guard boxed its limit slots.) The guard names its
/// listener, whose counters the metrics use; the log line keeps the protocol and, when the
/// format shows them, the User-Agent and Referer. (Then grew by 40 bytes: the exchange's
/// upstream leg keeps the hop its request was written for, with that parent's
/// Proxy-Authorization, and the route taken, both of which a retry through a new pick
/// replaces; and the client's pinned origin connections, one word. The pool key is kept
/// with its origin and its hash, one word more than the bare key, so that a kept-alive
/// request to the same origin neither rebuilds nor hashes it. Then by 56 bytes: the
/// request to the upstream layer carries the local address the client came in on (for
/// routes that bind to `same`), the user-name parameters, a sticky seed and the addresses a
/// PROXY protocol header to a parent names, and the request holds its connection's
/// parameters while it connects, as it holds its user. Then by 16 bytes: the bodies' tally,
/// the exchange's byte counts and its user's counters, so that a body counts towards its
/// user's quota as it moves and a body cut short still counts what it moved.)
const HTTP_BUDGET: usize = 3688;
/// (SOCKS: a handshake's state, with UDP ASSOCIATE's boxed, and the watch on the client
/// while the upstream connection is made, about 140 bytes: boxing it too would cost an
/// allocation per tunnel, and the handshake's future lives only until the tunnel's relay
/// task takes over. Then 64 bytes more: the session's user-name parameters, and the
/// upstream request's local address, parameters, sticky seed and PROXY protocol addresses
/// while it connects. Then 16 bytes: the logged-in user's traffic counters, found once
/// for the quota check and handed to the tunnel and the log line, and whether a UDP
/// association counted its bytes as they moved.)
const SOCKS_BUDGET: usize = 1960;
/// (The relay grew a little with its TLS options; the handshakes themselves are boxed.
/// Then 64 bytes more: the upstream request's local address, parameters, sticky seed and
/// PROXY protocol addresses.)
const PORTMAP_BUDGET: usize = 1280;
