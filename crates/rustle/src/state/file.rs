//! The usage file: JSON, replaced whole on every flush (written to a temporary file
//! beside it, synced, renamed over it), so that a crash leaves the last whole flush.
//! `write_private` is that replacement, for the users-API state file too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Usage;

pub(crate) struct File {
    path: PathBuf,
    /// Held through a flush: the keeper's and a hand-over's never interleave.
    writing: std::sync::Mutex<()>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Contents {
    version: u32,
    usage: Vec<Usage>,
}

const VERSION: u32 = 1;

impl File {
    pub(crate) fn new(path: PathBuf) -> File {
        File { path, writing: std::sync::Mutex::new(()) }
    }

    /// The usage written last; none when the file does not exist yet. A file that is not
    /// a usage file (cut short, foreign) is renamed aside to `PATH.corrupt` with a warning,
    /// and the usage starts empty.
    pub(crate) fn load(&self) -> std::io::Result<Vec<Usage>> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(with_path(&self.path, e)),
        };
        let why = match serde_json::from_slice::<Contents>(&text) {
            Ok(c) if c.version == VERSION => return Ok(c.usage),
            Ok(c) => format!("unknown version {}", c.version),
            Err(e) => e.to_string(),
        };
        let mut aside = self.path.clone().into_os_string();
        aside.push(".corrupt");
        let aside = PathBuf::from(aside);
        std::fs::rename(&self.path, &aside).map_err(|e| with_path(&self.path, e))?;
        tracing::warn!(
            "[state] path {}: not a usage file ({why}); moved to {}, usage starts empty",
            self.path.display(),
            aside.display()
        );
        Ok(Vec::new())
    }

    pub(crate) fn flush(&self, usage: &[Usage]) -> std::io::Result<()> {
        let c = Contents { version: VERSION, usage: usage.to_vec() };
        let text = serde_json::to_vec_pretty(&c).map_err(std::io::Error::other)?;
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        write_private(&self.path, &text).map_err(|e| with_path(&self.path, e))
    }
}

/// Temporary files made by this process so far: part of their names.
static TEMPORARIES: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `bytes`, mode 0600: written to a temporary file beside it of a
/// name no other writer uses (created exclusively, never through a symbolic link),
/// synced, renamed over it, then the directory synced; a crash leaves the old or the new
/// contents whole.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let (tmp, mut f) = loop {
        let n = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.{n}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let open = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp);
        match open {
            Ok(f) => break (tmp, f),
            // Left by a process of the same id that crashed: the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    };
    let mut write = || -> std::io::Result<()> {
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename itself is kept once the directory is synced.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn with_path(path: &std::path::Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rustle-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    #[test]
    fn a_corrupt_usage_file_is_moved_aside_and_usage_starts_empty() {
        let d = dir("corrupt");
        let path = d.join("usage.json");
        let cut_short = b"{\"version\": 1, \"usa";
        std::fs::write(&path, cut_short).expect("write");
        let f = File::new(path.clone());
        assert!(f.load().expect("load").is_empty());
        assert!(!path.exists());
        assert_eq!(std::fs::read(d.join("usage.json.corrupt")).expect("aside"), cut_short);
        f.flush(&[]).expect("flush");
        assert!(f.load().expect("load").is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_replacement_is_private_and_ignores_stale_temporaries_and_links() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = dir("private");
        let path = d.join("state.json");
        // A stale temporary of every name this process would try first is no obstacle,
        // and a link planted there is never followed.
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep").expect("victim");
        let next = TEMPORARIES.load(Ordering::Relaxed);
        for n in next..next + 3 {
            let tmp = d.join(format!("state.json.{}.{n}.tmp", std::process::id()));
            std::os::unix::fs::symlink(&victim, tmp).expect("link");
        }
        write_private(&path, b"secret").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"secret");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read(&victim).expect("victim"), b"keep");
        // Writers at once: each replacement whole.
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        write_private(&path, format!("{i}").repeat(1000).as_bytes())
                            .expect("write");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("join");
        }
        let text = std::fs::read(&path).expect("read");
        assert!(text.len() == 1000 && text.iter().all(|b| *b == text[0]));
        let _ = std::fs::remove_dir_all(&d);
    }
}
