//! What the HTTP codec costs per exchange, warm, on one core: the request head wrk sends
//! through a proxy (absolute-form GET and Host) parsed and rewritten for the origin, and
//! nginx's answer to it (eight fields and a 1 KB body) parsed and rewritten for the client,
//! the body copied behind the head as the proxy sends it.
//!
//! `cargo run --release -p rustle-proto --example head_cost` (pin it with `taskset -c 0`).
//! Prints nanoseconds per request head and per response, three rounds of two million each.

use std::hint::black_box;
use std::time::Instant;

use rustle_proto::http::{
    parse_request, parse_response, write_request, write_response, Limits, RequestHead,
    RequestRewrite, ResponseHead, ResponseRewrite,
};

const ROUNDS: u32 = 3;
const N: u32 = 2_000_000;

fn main() {
    let req = b"GET http://127.0.0.1:18080/1k HTTP/1.1\r\nHost: 127.0.0.1:18080\r\n\r\n";
    let mut resp = b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 30 Nov 2026 18:26:53 GMT\r\n\
Content-Type: application/octet-stream\r\nContent-Length: 1024\r\n\
Last-Modified: Mon, 30 Nov 2026 18:18:29 GMT\r\nConnection: keep-alive\r\nAccept-Ranges: bytes\r\n\r\n"
        .to_vec();
    resp.extend(std::iter::repeat_n(b'a', 1024));
    let limits = Limits::default();
    let (mut head, mut rhead) = (RequestHead::new(), ResponseHead::new());
    let mut out = Vec::with_capacity(4096);
    let rw = RequestRewrite {
        via: None,
        forwarded_for: None,
        upgrade: false,
        absolute: false,
        proxy_authorization: None,
    };
    for round in 1..=ROUNDS {
        let t = Instant::now();
        for _ in 0..N {
            if !matches!(parse_request(black_box(req), &limits, &mut head), Ok(Some(()))) {
                panic!("the request head does not parse");
            }
            out.clear();
            write_request(&head, req, &rw, &mut out);
            black_box(&out);
        }
        let request = t.elapsed().as_nanos() as f64 / f64::from(N);
        let t = Instant::now();
        for _ in 0..N {
            let parsed = parse_response(black_box(&resp), &limits, head.method, &mut rhead);
            if !matches!(parsed, Ok(Some(()))) {
                panic!("the response head does not parse");
            }
            out.clear();
            write_response(&rhead, &resp, &ResponseRewrite::default(), &mut out);
            out.extend_from_slice(&resp[rhead.len..]);
            black_box(&out);
        }
        let response = t.elapsed().as_nanos() as f64 / f64::from(N);
        println!("round {round}: request head {request:.0} ns, response {response:.0} ns");
    }
}
