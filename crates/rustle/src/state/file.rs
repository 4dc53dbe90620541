//! The usage file: JSON, replaced whole on every flush (written to a temporary file
//! beside it, synced, renamed over it), so that a crash leaves the last whole flush.

use std::io::Write;
use std::path::PathBuf;

use super::Usage;

pub(crate) struct File {
    path: PathBuf,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Contents {
    version: u32,
    usage: Vec<Usage>,
}

const VERSION: u32 = 1;

impl File {
    pub(crate) fn new(path: PathBuf) -> File {
        File { path }
    }

    /// The usage written last; none when the file does not exist yet.
    pub(crate) fn load(&self) -> std::io::Result<Vec<Usage>> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(with_path(&self.path, e)),
        };
        let c: Contents = serde_json::from_slice(&text)
            .map_err(|e| with_path(&self.path, std::io::Error::other(e)))?;
        if c.version != VERSION {
            let e = std::io::Error::other(format!("unknown version {}", c.version));
            return Err(with_path(&self.path, e));
        }
        Ok(c.usage)
    }

    pub(crate) fn flush(&self, usage: &[Usage]) -> std::io::Result<()> {
        let c = Contents { version: VERSION, usage: usage.to_vec() };
        let text = serde_json::to_vec_pretty(&c).map_err(std::io::Error::other)?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            // The rename itself is kept once the directory is synced.
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| with_path(&self.path, e))
    }
}

fn with_path(path: &std::path::Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
