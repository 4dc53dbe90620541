//! Response heads: the verdict does not depend on how the head arrived; an accepted
//! head is never ambiguous; the head the proxy forwards (with the options forward.rs
//! passes) re-parses to the same status, reason, body framing and kept fields; the
//! fields an HTTP/2 client gets for it have no hop-by-hop field and one Content-Length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_fuzz::{
    assert_unambiguous, count, cuts, h2_response_forwarded, head_prefix_contract, kept,
    response_fields,
};
use rustle_proto::http::{
    parse_response, write_response, BodyKind, Limits, Method, ResponseHead, ResponseRewrite,
};

const METHODS: [Method; 5] =
    [Method::Get, Method::Head, Method::Post, Method::Connect, Method::Options];

fuzz_target!(|data: &[u8]| {
    // First byte: the request's method and the client's side; the next four: where
    // the head is cut.
    let Some((&flags, rest)) = data.split_first() else { return };
    let (split, buf) = rest.split_at(rest.len().min(4));
    let method = METHODS[usize::from(flags & 7) % METHODS.len()];
    let limits = Limits::default();
    // Forwarding adds up to four fields (and their bytes): a head at the limits goes out
    // a little over them (`forwarding_adds_at_most_four_fields` in rustle-proto).
    let forwarded =
        Limits { max_head: limits.max_head + 1024, max_headers: limits.max_headers + 4 };
    let parse = |b: &[u8]| {
        let mut head = ResponseHead::new();
        parse_response(b, &limits, method, &mut head)
            .map(|r| r.map(|()| (head.len, head.status, response_fields(b, &head))))
    };
    head_prefix_contract(buf, cuts(split, buf.len()), parse);

    let mut head = ResponseHead::new();
    let Ok(Some(())) = parse_response(buf, &limits, method, &mut head) else { return };
    let before = response_fields(buf, &head);
    // A 2xx to CONNECT starts a tunnel; its framing fields are ignored (RFC 9112 6.3).
    let tunnel = method == Method::Connect && (200..300).contains(&head.status);
    if !tunnel {
        assert_unambiguous(&before, "accepted response");
    }
    let (client_http10, client_keep_alive, body_done) =
        (flags & 8 != 0, flags & 16 != 0, flags & 32 != 0);
    let via = (flags & 64 != 0).then_some("rustle");
    let dechunk = client_http10 && head.body == BodyKind::Chunked;
    let rw = if head.status == 101 {
        ResponseRewrite { via, upgrade: true, ..ResponseRewrite::default() }
    } else {
        let close = !client_keep_alive || head.body == BodyKind::CloseDelimited || dechunk;
        ResponseRewrite {
            via,
            close: close || !body_done,
            keep_alive_10: client_http10 && !close,
            upgrade: false,
            dechunk,
        }
    };
    let mut out = Vec::new();
    write_response(&head, buf, &rw, &mut out);
    let mut again = ResponseHead::new();
    assert_eq!(
        parse_response(&out, &forwarded, method, &mut again),
        Ok(Some(())),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(again.len, out.len());
    assert_eq!(again.status, head.status);
    assert_eq!(again.reason.get(&out), head.reason.get(buf));
    let body = if dechunk { BodyKind::CloseDelimited } else { head.body };
    assert_eq!(again.body, body);
    let after = response_fields(&out, &again);
    assert_eq!(kept(&after, &before), kept(&before, &after));
    if !tunnel {
        assert_unambiguous(&after, "forwarded response");
    }
    assert!(count(&after, b"content-length") <= 1);
    if rw.close {
        assert!(!again.keep_alive());
    }
    // The same head, for an HTTP/2 client.
    if !tunnel && head.status != 101 {
        h2_response_forwarded(buf, &head, via);
    }
});
