//! Protocol detection: no panic, and a prefix is undecided or decides the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_proto::detect::detect;

fuzz_target!(|data: &[u8]| {
    let whole = detect(data);
    for i in 0..data.len().min(8) {
        let got = detect(&data[..i]);
        assert!(got == Ok(None) || got == whole, "{data:02x?}: prefix {i}: {got:?}");
    }
});
