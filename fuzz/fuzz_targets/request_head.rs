//! Request heads: the verdict does not depend on how the head arrived; an accepted
//! head is never ambiguous; the head the proxy forwards re-parses to the same method,
//! target, body framing and kept fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_fuzz::{assert_unambiguous, count, cuts, head_prefix_contract, kept, request_fields};
use rustle_proto::http::{
    parse_request, write_request, Limits, RequestHead, RequestRewrite, Target,
};

fuzz_target!(|data: &[u8]| {
    // First byte: rewrite options; the next four: where the head is cut.
    let Some((&flags, rest)) = data.split_first() else { return };
    let (split, buf) = rest.split_at(rest.len().min(4));
    let limits = Limits::default();
    // Forwarding adds up to four fields (and their bytes): a head at the limits goes out
    // a little over them (`forwarding_adds_at_most_four_fields` in rustle-proto).
    let forwarded =
        Limits { max_head: limits.max_head + 1024, max_headers: limits.max_headers + 4 };
    let parse = |b: &[u8]| {
        let mut head = RequestHead::new();
        parse_request(b, &limits, &mut head)
            .map(|r| r.map(|()| (head.len, request_fields(b, &head))))
    };
    head_prefix_contract(buf, cuts(split, buf.len()), parse);

    let mut head = RequestHead::new();
    let Ok(Some(())) = parse_request(buf, &limits, &mut head) else { return };
    let before = request_fields(buf, &head);
    assert_unambiguous(&before, "accepted request");
    let rw = RequestRewrite {
        via: (flags & 1 != 0).then_some("rustle"),
        forwarded_for: Some(if flags & 2 != 0 { "2001:db8::7" } else { "192.0.2.7" }),
        upgrade: head.is_upgrade(),
        absolute: false,
        proxy_authorization: None,
    };
    let mut out = Vec::new();
    write_request(&head, buf, &rw, &mut out);
    // The proxy forwards absolute-form requests only.
    let Target::Absolute { authority, path, .. } = head.target else { return };
    let mut again = RequestHead::new();
    assert_eq!(
        parse_request(&out, &forwarded, &mut again),
        Ok(Some(())),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(again.len, out.len());
    assert_eq!(again.method, head.method);
    assert_eq!(again.method_span.get(&out), head.method_span.get(buf));
    assert_eq!(again.body, head.body);
    let p = path.get(buf);
    let want = if p.first() == Some(&b'/') { p.to_vec() } else { [b"/", p].concat() };
    assert_eq!(again.target_span.get(&out), &want[..]);
    assert_eq!(again.host.map(|h| h.get(&out)), Some(authority.get(buf)));
    let after = request_fields(&out, &again);
    assert_eq!(kept(&after, &before), kept(&before, &after));
    assert_unambiguous(&after, "forwarded request");
    assert!(count(&after, b"content-length") <= 1);
    assert_eq!(count(&after, b"host"), 1);
});
