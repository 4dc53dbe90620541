//! SOCKS4/4a requests: the prefix contract (every prefix is `Ok(None)` or the whole
//! input's verdict), and an accepted request's user id lies within it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_fuzz::prefix_contract;
use rustle_proto::socks4;

fuzz_target!(|data: &[u8]| {
    // A request is at most 8 + 256 + 256 bytes; the rest cannot change the verdict.
    let buf = &data[..data.len().min(600)];
    prefix_contract(buf, socks4::parse_request);
    if let Ok(Some((req, n))) = socks4::parse_request(buf) {
        assert!(n <= buf.len());
        assert_eq!(req.user(buf).len(), req.user_len);
        assert!(!req.user(buf).contains(&0));
    }
});
