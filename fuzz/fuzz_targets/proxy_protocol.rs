//! PROXY protocol v1/v2 headers: no panic, the prefix contract for each accepted
//! version set, and what carries addresses re-writes and parses back to them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_fuzz::proxy_protocol_any;
use rustle_proto::proxy_protocol::MAX_HEADER;

fuzz_target!(|data: &[u8]| {
    proxy_protocol_any(&data[..data.len().min(MAX_HEADER + 16)]);
});
