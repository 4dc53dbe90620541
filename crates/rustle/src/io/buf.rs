//! A read buffer with a consumed prefix: heads are parsed in place, body bytes that
//! arrived with a head are forwarded from it, and whatever follows (a pipelined request)
//! stays for the next round.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes read per call once a buffer exists. Large enough that a bulk body moves in few
/// syscalls, small enough that thousands of connections fit in little memory.
pub(crate) const READ_SIZE: usize = 16 * 1024;

pub(crate) struct Buf {
    data: Vec<u8>,
    start: usize,
    end: usize,
}

impl Buf {
    pub(crate) fn with_storage() -> Self {
        Buf { data: vec![0; READ_SIZE], start: 0, end: 0 }
    }

    /// The bytes read and not yet consumed.
    pub(crate) fn filled(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Size of the storage (grown buffers are not pooled).
    pub(crate) fn capacity(&self) -> usize {
        self.data.len()
    }

    /// Appends `bytes` after the filled ones (bytes read elsewhere, such as what a parent
    /// proxy sent with its reply).
    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.data.truncate(self.end);
        self.data.extend_from_slice(bytes);
        self.end = self.data.len();
    }

    pub(crate) fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Reads once, appending to the filled bytes; the buffer grows up to `max` when it is
    /// full of unconsumed bytes (a large head). Returns 0 at end of stream, and an
    /// `OutOfMemory` error when `max` is reached.
    pub(crate) async fn read_from<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        max: usize,
    ) -> io::Result<usize> {
        if self.end == self.data.len() {
            if self.start > 0 {
                self.data.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.data.len() < max {
                let new_len = (self.data.len() * 2).max(READ_SIZE).min(max);
                self.data.resize(new_len, 0);
            } else {
                return Err(io::Error::new(io::ErrorKind::OutOfMemory, "buffer full"));
            }
        }
        let n = r.read(&mut self.data[self.end..]).await?;
        self.end += n;
        Ok(n)
    }
}

/// An empty buffer owns no storage; it gets some on its first read.
impl Default for Buf {
    fn default() -> Self {
        Buf { data: Vec::new(), start: 0, end: 0 }
    }
}
