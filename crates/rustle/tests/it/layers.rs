//! The module graph against ARCHITECTURE.md's layers: every `crate::` path in the proxy's
//! sources (tests aside) names a module of the same folder or of a layer below.

use std::path::{Path, PathBuf};

/// The layers from the top down, as ARCHITECTURE.md draws them: a folder (its modules
/// may use each other) or a module of its own.
const LAYERS: [&str; 12] = [
    "run",
    "front",
    "upstream",
    "policy",
    "telemetry",
    "io",
    "state",
    "limits",
    "error",
    "config",
    "acl",
    "protocol",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The layer a source file belongs to (None for `lib.rs`, `main.rs` and test files).
fn layer_of(src: &Path, file: &Path) -> Option<&'static str> {
    let rel = file.strip_prefix(src).ok()?;
    let name = rel.file_name()?.to_str()?;
    if name == "tests.rs"
        || name == "proptests.rs"
        || rel.components().any(|c| c.as_os_str() == "tests")
    {
        return None;
    }
    let first = rel.components().next()?.as_os_str().to_str()?;
    let first = first.strip_suffix(".rs").unwrap_or(first);
    LAYERS.iter().copied().find(|l| *l == first)
}

#[test]
fn every_import_points_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let rank = |l: &str| LAYERS.iter().position(|x| *x == l);
    let mut up = Vec::new();
    let mut arrows = 0;
    for file in &files {
        let Some(from) = layer_of(&src, file) else { continue };
        let text = std::fs::read_to_string(file).expect("read");
        // Unit tests inside the file may reach anywhere.
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for (i, _) in text.match_indices("crate::") {
            let to: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let Some(r) = rank(&to) else {
                panic!("{}: `crate::{to}` is in no layer of ARCHITECTURE.md", file.display());
            };
            arrows += 1;
            if r < rank(from).expect("ranked") {
                up.push((
                    from,
                    LAYERS[r],
                    file.strip_prefix(&src).expect("in src").display().to_string(),
                ));
            }
        }
    }
    assert!(
        files.len() > 80 && arrows > 300,
        "{} files, {arrows} paths: not the sources?",
        files.len()
    );
    up.sort();
    up.dedup();
    assert!(up.is_empty(), "imports pointing up the layers: {up:#?}");
}
