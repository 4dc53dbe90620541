//! Raw std::net HTTP client helpers shared by the fixture tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// A parsed response; `head` is the raw head bytes including CRLFCRLF.
#[derive(Debug)]
pub(crate) struct Resp {
    pub status: u16,
    pub head: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Trailer lines (raw) for chunked bodies.
    pub trailers: Vec<String>,
    /// Sizes of the chunks as they came on the wire.
    pub chunk_sizes: Vec<usize>,
}

impl Resp {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Buffered reader over a stream that keeps leftovers between responses.
pub(crate) struct Reader<S> {
    pub s: S,
    buf: Vec<u8>,
}

impl<S: Read> Reader<S> {
    pub(crate) fn new(s: S) -> Self {
        Reader { s, buf: Vec::new() }
    }

    fn more(&mut self) -> usize {
        let mut tmp = [0u8; 65536];
        let n = self.s.read(&mut tmp).unwrap();
        self.buf.extend_from_slice(&tmp[..n]);
        n
    }

    pub(crate) fn take(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.more() > 0, "EOF while reading {n} bytes");
        }
        self.buf.drain(..n).collect()
    }

    pub(crate) fn line(&mut self) -> Vec<u8> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                return self.buf.drain(..=i).collect();
            }
            assert!(self.more() > 0, "EOF while reading a line");
        }
    }

    pub(crate) fn read_to_eof(&mut self) -> Vec<u8> {
        while self.more() > 0 {}
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn head(&mut self) -> Vec<u8> {
        loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return self.buf.drain(..i + 4).collect();
            }
            assert!(self.more() > 0, "EOF while reading a head");
        }
    }

    /// Reads one response; `head_request` means no body follows.
    pub(crate) fn response(&mut self, head_request: bool) -> Resp {
        let head = self.head();
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut hs);
        assert!(r.parse(&head).unwrap().is_complete());
        let status = r.code.unwrap();
        let headers: Vec<(String, String)> = r
            .headers
            .iter()
            .map(|h| (h.name.to_string(), String::from_utf8(h.value.to_vec()).unwrap()))
            .collect();
        let mut resp = Resp {
            status,
            head,
            headers,
            body: Vec::new(),
            trailers: Vec::new(),
            chunk_sizes: Vec::new(),
        };
        if head_request || status == 204 || status == 304 || status == 101 || status / 100 == 1 {
            return resp;
        }
        if let Some(cl) = resp.header("content-length") {
            resp.body = self.take(cl.parse().unwrap());
        } else if resp.header("transfer-encoding") == Some("chunked") {
            loop {
                let line = self.line();
                let text = std::str::from_utf8(&line).unwrap().trim_end();
                let size = usize::from_str_radix(text, 16).unwrap();
                if size == 0 {
                    break;
                }
                resp.chunk_sizes.push(size);
                let data = self.take(size);
                resp.body.extend_from_slice(&data);
                assert_eq!(self.take(2), b"\r\n");
            }
            loop {
                let line = self.line();
                if line == b"\r\n" {
                    break;
                }
                resp.trailers.push(String::from_utf8(line).unwrap().trim_end().to_string());
            }
        } else {
            resp.body = self.read_to_eof();
        }
        resp
    }
}

/// Sends `req` on a fresh connection and reads one response.
pub(crate) fn exchange(addr: SocketAddr, req: &[u8]) -> Resp {
    let mut s = connect(addr);
    s.write_all(req).unwrap();
    let head_req = req.starts_with(b"HEAD ");
    Reader::new(s).response(head_req)
}

pub(crate) fn get(addr: SocketAddr, path: &str) -> Resp {
    exchange(addr, format!("GET {path} HTTP/1.1\r\nHost: origin\r\n\r\n").as_bytes())
}

/// Writes `data` on a fresh connection to `addr` from another thread, half-closes,
/// and returns everything read until the other end's EOF (which therefore had to
/// come after the client's FIN went through).
pub(crate) fn send_all_then_read_to_eof(addr: SocketAddr, data: &[u8]) -> Vec<u8> {
    let mut s = connect(addr);
    let mut w = s.try_clone().unwrap();
    let sent = data.to_vec();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    got
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    rustle_bench::pattern::hex(&sha2::Sha256::digest(data))
}
