//! What the fuzz targets share: how bytes arrive in pieces, decoded from the input. The
//! checks themselves are `rustle_proto::check`, which the property tests in
//! `crates/proto/src/props.rs` use too.

pub use rustle_proto::check::*;

/// Split points taken from the input: up to `n` cuts, each a byte of `data` read as
/// a fraction of `len`.
pub fn cuts(data: &[u8], len: usize) -> Vec<usize> {
    let mut v: Vec<usize> = data.iter().map(|&b| usize::from(b) * (len + 1) / 256).collect();
    v.sort_unstable();
    v
}
