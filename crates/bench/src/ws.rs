//! Minimal RFC 6455 WebSocket echo for `GET /ws`: the handshake, then every
//! data frame is sent back with the same opcode and FIN bit (so fragmented
//! messages come back fragmented), pings get pongs, close gets close.

use std::io;
use std::sync::atomic::Ordering;

use base64::Engine as _;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::{Conn, FLUSH_AT};
use crate::http::{HttpStats, Next};
use crate::routes;

/// The GUID RFC 6455 appends to the client key.
const WS_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Larger frames are refused with close code 1009 (message too big).
const MAX_PAYLOAD: u64 = 64 * 1024 * 1024;

const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(key);
    h.update(WS_GUID);
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

pub(crate) async fn upgrade<S>(
    conn: &mut Conn<S>,
    stats: &HttpStats,
    key: Option<&[u8]>,
) -> io::Result<Next>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(key) = key else {
        routes::reject(conn, 400).await;
        return Ok(Next::Done);
    };
    let out = &mut conn.out;
    routes::start(out, 101);
    out.extend_from_slice(b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ");
    out.extend_from_slice(accept_key(key).as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    conn.flush().await?;
    echo_frames(conn, stats).await?;
    Ok(Next::Done)
}

async fn echo_frames<S>(conn: &mut Conn<S>, stats: &HttpStats) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut payload = Vec::new();
    loop {
        // A clean EOF between frames just ends the session.
        if conn.pos == conn.end && conn.fill().await? == 0 {
            return Ok(());
        }
        conn.need(2).await?;
        let b0 = conn.buf[conn.pos];
        let b1 = conn.buf[conn.pos + 1];
        let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0f);
        let masked = b1 & 0x80 != 0;
        let (len, mut hdr) = match b1 & 0x7f {
            126 => {
                conn.need(4).await?;
                let b = &conn.buf[conn.pos + 2..conn.pos + 4];
                (u64::from(u16::from_be_bytes([b[0], b[1]])), 4)
            }
            127 => {
                conn.need(10).await?;
                let mut b = [0u8; 8];
                b.copy_from_slice(&conn.buf[conn.pos + 2..conn.pos + 10]);
                (u64::from_be_bytes(b), 10)
            }
            n => (u64::from(n), 2),
        };
        let mut mask = [0u8; 4];
        if masked {
            conn.need(hdr + 4).await?;
            mask.copy_from_slice(&conn.buf[conn.pos + hdr..conn.pos + hdr + 4]);
            hdr += 4;
        }
        conn.pos += hdr;
        if len > MAX_PAYLOAD {
            write_frame(conn, true, OP_CLOSE, &1009u16.to_be_bytes()).await?;
            conn.close_gracefully().await;
            return Ok(());
        }
        read_payload(conn, len, &mut payload).await?;
        if masked {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i & 3];
            }
        }
        match opcode {
            0x0..=0x2 => {
                write_frame(conn, fin, opcode, &payload).await?;
                if fin {
                    stats.ws_messages.fetch_add(1, Ordering::Relaxed);
                }
            }
            OP_PING => write_frame(conn, true, OP_PONG, &payload).await?,
            OP_PONG => {}
            OP_CLOSE => {
                write_frame(conn, true, OP_CLOSE, &payload).await?;
                conn.close_gracefully().await;
                return Ok(());
            }
            _ => {
                // Unknown opcode: protocol error (1002).
                write_frame(conn, true, OP_CLOSE, &1002u16.to_be_bytes()).await?;
                conn.close_gracefully().await;
                return Ok(());
            }
        }
        if conn.pos == conn.end || conn.out.len() >= FLUSH_AT {
            conn.flush().await?;
        }
    }
}

async fn read_payload<S>(conn: &mut Conn<S>, len: u64, payload: &mut Vec<u8>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    payload.clear();
    let mut left = len;
    while left > 0 {
        if conn.pos == conn.end {
            conn.fill_more().await?;
        }
        // Bounded by the buffered amount, which is a usize.
        let take = left.min((conn.end - conn.pos) as u64) as usize;
        payload.extend_from_slice(&conn.buf[conn.pos..conn.pos + take]);
        conn.pos += take;
        left -= take as u64;
    }
    Ok(())
}

/// Queues one unmasked server frame.
async fn write_frame<S>(conn: &mut Conn<S>, fin: bool, opcode: u8, payload: &[u8]) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let out = &mut conn.out;
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        // Fits: the arm is bounded by u16::MAX.
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    conn.send(payload).await
}
