//! The chunked scanner: the same verdict and the same bytes passed on however the
//! body is split, byte by byte included, forwarding as it is and de-chunking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_fuzz::{assert_same_outcome, cuts, scan_split, Ending};

fuzz_target!(|data: &[u8]| {
    // First byte: how many cut bytes follow (0..=7) and whether to de-chunk.
    let Some((&flags, rest)) = data.split_first() else { return };
    let dechunk = flags & 8 != 0;
    let (split, body) = rest.split_at(rest.len().min(usize::from(flags & 7)));
    let whole = scan_split(body, &[], dechunk);
    assert!(whole.consumed <= body.len());
    if whole.ending == Ending::Done && !dechunk {
        // What is passed on is the body minus trailer lines: never more.
        assert!(whole.forwarded.len() <= whole.consumed);
    }
    assert_same_outcome(&scan_split(body, &cuts(split, body.len()), dechunk), &whole);
    let every: Vec<usize> = (0..body.len()).collect();
    assert_same_outcome(&scan_split(body, &every, dechunk), &whole);
});
