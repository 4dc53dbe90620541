//! HTTP/2 requests written as HTTP/1.1 heads (`write_h2_request`): the head parses back
//! to the same method, target, Host and framing; it keeps every field it should, in
//! order; the cookies go as one field; the proxy's Via, addresses and credentials are
//! there as asked, and never two lengths.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_fuzz::{h2_options, h2_request_forwarded, Fields};
use rustle_proto::http::H2Request;

fuzz_target!(|data: &[u8]| {
    // First byte: rewrite options and framing (`h2_options`); then lines: method,
    // authority, path, and a field a line (`name:value`).
    let Some((&flags, rest)) = data.split_first() else { return };
    let mut lines = rest.split(|&b| b == b'\n');
    let (Some(method), Some(authority), Some(path)) = (lines.next(), lines.next(), lines.next())
    else {
        return;
    };
    let fields: Fields = lines
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            Some((line[..colon].to_vec(), line[colon + 1..].to_vec()))
        })
        .collect();
    let (rw, body) = h2_options(flags, u64::from(flags) << 20);
    h2_request_forwarded(&H2Request { method, authority, path }, &fields, &rw, body);
});
