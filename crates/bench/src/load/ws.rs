//! The WebSocket client side of ws mode: masked binary messages of a fixed
//! size, pre-built once per lane, and strict checking of the echo.

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::response::Reader;
use super::stats::ErrorKind;
use crate::pattern;

const FIN_BINARY: u8 = 0x82;
const FIN_CLOSE: u8 = 0x88;

/// One client frame (FIN, `opcode`, masked with `mask`) carrying `payload`.
pub(crate) fn frame(first: u8, mask: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 14);
    f.push(first);
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        // Fits: the arm is bounded by u16::MAX.
        n if n <= usize::from(u16::MAX) => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    f
}

/// The message frame and the close frame for one lane. Masks come from the
/// seed and the lane index, so runs are reproducible but lanes differ.
pub(crate) struct Frames {
    pub(crate) message: Box<[u8]>,
    pub(crate) close: Box<[u8]>,
    pub(crate) size: usize,
}

impl Frames {
    pub(crate) fn new(size: usize, seed: u64, lane: usize) -> Frames {
        let mask = splitmix64(seed ^ (lane as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mask = [mask as u8, (mask >> 8) as u8, (mask >> 16) as u8, (mask >> 24) as u8];
        Frames {
            message: frame(FIN_BINARY, mask, &pattern::pattern(size)).into(),
            close: frame(FIN_CLOSE, mask, &1000u16.to_be_bytes()).into(),
            size,
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Reads one unmasked server frame that must be `first` (FIN + opcode);
/// skips its payload and returns the payload length.
async fn read_frame<S: AsyncRead + Unpin>(
    io: &mut S,
    reader: &mut Reader,
    first: u8,
) -> Result<u64, ErrorKind> {
    reader.need(io, 2).await?;
    let b = reader.buffered();
    let (b0, b1) = (b[0], b[1]);
    // Servers must not mask; a fragment or another opcode is not our echo.
    if b0 != first || b1 & 0x80 != 0 {
        return Err(ErrorKind::Parse);
    }
    let (len, hdr) = match b1 & 0x7f {
        126 => {
            reader.need(io, 4).await?;
            let b = reader.buffered();
            (u64::from(u16::from_be_bytes([b[2], b[3]])), 4)
        }
        127 => {
            reader.need(io, 10).await?;
            let mut n = [0u8; 8];
            n.copy_from_slice(&reader.buffered()[2..10]);
            (u64::from_be_bytes(n), 10)
        }
        n => (u64::from(n), 2),
    };
    reader.advance(hdr);
    reader.skip(io, len).await?;
    Ok(len)
}

/// Sends one message and waits for its echo; returns the echo's wire bytes.
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    reader: &mut Reader,
    frames: &Frames,
) -> Result<u64, ErrorKind> {
    io.write_all(&frames.message).await.map_err(|_| ErrorKind::Write)?;
    io.flush().await.map_err(|_| ErrorKind::Write)?;
    reader.start();
    let len = read_frame(io, reader, FIN_BINARY).await?;
    if len != frames.size as u64 {
        return Err(ErrorKind::Parse);
    }
    Ok(reader.consumed())
}

/// The closing handshake: our close, the echoed close, then the server's EOF.
pub(crate) async fn close<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    reader: &mut Reader,
    frames: &Frames,
) -> Result<(), ErrorKind> {
    io.write_all(&frames.close).await.map_err(|_| ErrorKind::Write)?;
    io.flush().await.map_err(|_| ErrorKind::Write)?;
    read_frame(io, reader, FIN_CLOSE).await?;
    reader.expect_eof(io).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_masked_and_sized() {
        let f = Frames::new(200, 1, 2);
        assert_eq!(f.message[0], 0x82);
        assert_eq!(f.message[1], 0x80 | 126);
        assert_eq!(u16::from_be_bytes([f.message[2], f.message[3]]), 200);
        assert_eq!(f.message.len(), 4 + 4 + 200);
        let mask = &f.message[4..8];
        assert_eq!(f.message[8 + 7] ^ mask[3], pattern::pattern_byte(7));
        assert_eq!(frame(0x82, [0; 4], &[0; 70_000])[1], 0x80 | 127);
        assert_ne!(Frames::new(1, 1, 3).message[2..6], f.message[4..8]);
    }
}
