//! Deserializing a whole document while collecting every error in it, not only the first:
//! a value that does not deserialize is recorded with its key path and taken out (it then
//! takes its default), and the rest is deserialized again, so that one type error hides
//! nothing after it. Paths are given as in the file: an array index counts the entries as
//! written, whatever was taken out before them.

use std::cmp::Ordering;

use serde::de::DeserializeOwned;
use toml::Value;

/// A key path: map keys and array indexes (as text).
pub(super) type Path = Vec<String>;

/// Values taken out at most: each round of deserialization takes one out, so past this
/// many errors the file is reported as having too many to list.
const MAX_ERRORS: usize = 100;

/// A document deserialized with every error collected.
pub(super) struct Collected<T> {
    /// The value, with each value that did not deserialize taken out (its default in its
    /// place, or, for a table missing a required key, the whole table left out).
    pub(crate) value: T,
    /// Each value that did not deserialize: where, and why.
    pub(crate) errors: Vec<(Path, String)>,
    /// Keys nothing reads.
    pub(crate) unknown: Vec<Path>,
    /// Where the deserialized value differs from the document: what was taken out, in the
    /// document's own paths.
    pub(crate) removed: Removed,
}

/// What was taken out of a document, to translate paths of what remains into the
/// document's own (an entry taken out of an array moves the next ones down).
#[derive(Default)]
pub(super) struct Removed {
    document: Option<Value>,
    paths: Vec<Path>,
    /// Where errors were: the table entry (`listener.2`) or key (`timeouts.header`) each
    /// was in, for checks that should not speak again of what is already reported.
    damaged: Vec<Path>,
}

impl Removed {
    /// The document's own path of `path`, a path in what remains.
    pub(super) fn original(&self, path: &[String]) -> Path {
        let Some(doc) = &self.document else { return path.to_vec() };
        let mut out: Path = Vec::with_capacity(path.len());
        let mut node = Some(doc);
        for seg in path {
            match (node, seg.parse::<usize>()) {
                (Some(Value::Array(items)), Ok(index)) => {
                    // The index-th entry among those not taken out.
                    let kept = (0..items.len()).filter(|&i| {
                        let mut p = out.clone();
                        p.push(i.to_string());
                        !self.paths.contains(&p)
                    });
                    let i = kept.clone().nth(index).unwrap_or(index);
                    out.push(i.to_string());
                    node = items.get(i);
                }
                (Some(Value::Table(t)), _) => {
                    out.push(seg.clone());
                    node = t.get(seg.as_str());
                }
                _ => {
                    out.push(seg.clone());
                    node = None;
                }
            }
        }
        out
    }

    /// Whether `original` (a document path) lies in a table entry or at a key where a value
    /// did not deserialize.
    pub(super) fn is_damaged(&self, original: &[String]) -> bool {
        self.damaged.iter().any(|d| original.starts_with(d))
    }
}

/// Deserializes `document` into `T`, collecting every error and unknown key.
pub(super) fn deserialize<T: DeserializeOwned + Default>(document: Value) -> Collected<T> {
    let mut removed = Removed { document: Some(document), ..Default::default() };
    let mut errors: Vec<(Path, String)> = Vec::new();
    let mut unknown: Vec<Path> = Vec::new();
    let doc = removed.document.clone().unwrap_or(Value::Table(Default::default()));
    loop {
        let pruned = prune(&doc, &removed.paths);
        let mut ignored = Vec::new();
        let result: Result<T, _> = serde_path_to_error::deserialize(
            serde_ignored::Deserializer::new(pruned, &mut |p: serde_ignored::Path<'_>| {
                ignored.push(path_segments(&p))
            }),
        );
        for path in ignored {
            let path = removed.original(&path);
            if !unknown.contains(&path) {
                unknown.push(path);
            }
        }
        let e = match result {
            Ok(value) => return Collected { value, errors, unknown, removed },
            Err(e) => e,
        };
        let path = removed.original(&error_path(&e));
        let mut message = reword(e.inner().message().trim());
        // The value itself, when the message does not show it ("invalid socket address
        // syntax, found "nowhere"").
        if let Some(value) = value_at(&doc, &path) {
            let shown = match value {
                Value::String(s) => Some((s.clone(), value.to_string())),
                Value::Table(_) | Value::Array(_) => None,
                v => Some((v.to_string(), v.to_string())),
            };
            if let Some((_, toml)) = shown.filter(|(bare, _)| !message.contains(bare.as_str())) {
                message = format!("{message}, found {toml}");
            }
        }
        // A table whose required key was taken out for its own error is taken out whole,
        // without a second report ("missing field") of the same mistake.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
            .map(|key| [path.as_slice(), &[key.to_string()]].concat());
        if !missing.is_some_and(|m| removed.paths.contains(&m)) {
            errors.push((path.clone(), message));
        }
        let entry = match path.iter().position(|s| s.parse::<usize>().is_ok()) {
            Some(i) => path[..=i].to_vec(),
            None => path.clone(),
        };
        if !removed.damaged.contains(&entry) {
            removed.damaged.push(entry);
        }
        // The root itself cannot be taken out; nor can anything twice.
        if path.is_empty() || removed.paths.contains(&path) || errors.len() >= MAX_ERRORS {
            if errors.len() >= MAX_ERRORS {
                errors.push((Vec::new(), format!("more than {MAX_ERRORS} errors: stopped")));
            }
            return Collected { value: T::default(), errors, unknown, removed };
        }
        removed.paths.push(path);
    }
}

/// serde's "invalid type: string "two", expected usize" in the words of the file: "expected
/// a number, found "two"". Other messages are kept as they are.
fn reword(message: &str) -> String {
    let (found, expected, is_value) = match message
        .strip_prefix("invalid type: ")
        .map(|m| (m, false))
        .or_else(|| message.strip_prefix("invalid value: ").map(|m| (m, true)))
        .and_then(|(m, is_value)| m.rsplit_once(", expected ").map(|(f, e)| (f, e, is_value)))
    {
        Some(parts) => parts,
        None => return message.to_string(),
    };
    let expected = match expected {
        "u8" if is_value => "a number from 0 to 255",
        "u16" if is_value => "a number from 0 to 65535",
        "u32" if is_value => "a number from 0 to 4294967295",
        "u64" | "usize" if is_value => "a number, 0 or more",
        "u8" | "u16" | "u32" | "u64" | "usize" | "i8" | "i16" | "i32" | "i64" | "isize" => {
            "a number"
        }
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a sequence" => "a list",
        "socket address" => "an address and port (\"127.0.0.1:3128\", \"[::1]:3128\")",
        e if e.starts_with("struct ") || e == "a map" => "a table",
        e => e,
    };
    // `string "two"`, `integer `5``, `floating point `1.5``, `boolean `true``: the value as
    // written in TOML.
    let found = match found.split_once(' ') {
        Some(("string", s)) => s.to_string(),
        Some(("integer" | "boolean", v)) => v.trim_matches('`').to_string(),
        Some(("floating", v)) => v.trim_start_matches("point ").trim_matches('`').to_string(),
        _ if found == "sequence" => "a list".to_string(),
        _ if found == "map" => "a table".to_string(),
        _ => found.to_string(),
    };
    format!("expected {expected}, found {found}")
}

/// The value at `path` (a document path), if there is one.
fn value_at<'a>(document: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(document, |node, seg| match node {
        Value::Table(t) => t.get(seg.as_str()),
        Value::Array(a) => a.get(seg.parse::<usize>().ok()?),
        _ => None,
    })
}

/// The path of a deserialization error (up to a part it cannot name).
fn error_path<E>(e: &serde_path_to_error::Error<E>) -> Path {
    use serde_path_to_error::Segment;
    let mut out = Vec::new();
    for seg in e.path().iter() {
        match seg {
            Segment::Seq { index } => out.push(index.to_string()),
            Segment::Map { key } => out.push(key.clone()),
            Segment::Enum { variant } => out.push(variant.clone()),
            Segment::Unknown => break,
        }
    }
    out
}

/// The path serde_ignored gives an unknown key, as segments.
fn path_segments(path: &serde_ignored::Path<'_>) -> Path {
    use serde_ignored::Path;
    let mut segs = Vec::new();
    let mut p = path;
    loop {
        match p {
            Path::Root => break,
            Path::Seq { parent, index } => {
                segs.push(index.to_string());
                p = parent;
            }
            Path::Map { parent, key } => {
                segs.push(key.clone());
                p = parent;
            }
            Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => p = parent,
        }
    }
    segs.reverse();
    segs
}

/// `document` without the values at `paths` (document paths). The deepest and last are
/// taken out first, so that taking out an array entry never moves one still to be taken
/// out.
fn prune(document: &Value, paths: &[Path]) -> Value {
    let mut doc = document.clone();
    let mut paths: Vec<&Path> = paths.iter().collect();
    paths.sort_by(|a, b| compare(b, a));
    for path in paths {
        remove(&mut doc, path);
    }
    doc
}

/// Takes the value at `path` out of `node`, if it is there.
fn remove(node: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else { return };
    match (node, rest.is_empty()) {
        (Value::Table(t), true) => {
            t.remove(first.as_str());
        }
        (Value::Table(t), false) => {
            if let Some(child) = t.get_mut(first.as_str()) {
                remove(child, rest);
            }
        }
        (Value::Array(a), last) => match first.parse::<usize>() {
            Ok(i) if i < a.len() && last => {
                a.remove(i);
            }
            Ok(i) => {
                if let Some(child) = a.get_mut(i) {
                    remove(child, rest);
                }
            }
            Err(_) => {}
        },
        _ => {}
    }
}

/// Paths in document order, an index compared as a number, a path before those below it.
fn compare(a: &Path, b: &Path) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = match (x.parse::<usize>(), y.parse::<usize>()) {
            (Ok(i), Ok(j)) => i.cmp(&j),
            _ => x.cmp(y),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(default)]
    struct Doc {
        n: u32,
        item: Vec<Item>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Item {
        name: String,
        #[serde(default)]
        size: u32,
    }

    fn collect(text: &str) -> Collected<Doc> {
        deserialize(Value::Table(text.parse().expect("toml")))
    }

    fn path(s: &str) -> Path {
        s.split('.').map(String::from).collect()
    }

    #[test]
    fn every_error_is_collected_with_its_path_as_written() {
        let c = collect(
            "n = \"x\"\n[[item]]\nname = 1\n[[item]]\nname = \"b\"\nsize = \"big\"\n\
             [[item]]\nname = \"c\"\nextra = 2\n[[item]]\nsize = 3\n",
        );
        let mut errors = c.errors.clone();
        errors.sort_by(|a, b| compare(&a.0, &b.0));
        let paths: Vec<&Path> = errors.iter().map(|(p, _)| p).collect();
        // `item.0.name` once: its table is left out without a "missing field" for it.
        assert_eq!(
            paths,
            [&path("item.0.name"), &path("item.1.size"), &path("item.3"), &path("n")]
        );
        assert!(errors[2].1.contains("missing field `name`"), "{errors:?}");
        assert_eq!(c.unknown, [path("item.2.extra")]);
        // What remains: items 1 (its size at the default) and 2.
        let names: Vec<&str> = c.value.item.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(c.value.item[0].size, 0);
        // Paths in what remains map back to the file's.
        assert_eq!(c.removed.original(&path("item.1.name")), path("item.2.name"));
        assert_eq!(c.removed.original(&path("item.0")), path("item.1"));
        assert!(c.removed.is_damaged(&path("item.1.name")));
        assert!(!c.removed.is_damaged(&path("item.2.name")));
    }

    #[test]
    fn messages_say_what_was_expected_and_found() {
        let table = [
            ("invalid type: string \"two\", expected usize", "expected a number, found \"two\""),
            (
                "invalid value: integer `-5`, expected usize",
                "expected a number, 0 or more, found -5",
            ),
            (
                "invalid value: integer `70000`, expected u16",
                "expected a number from 0 to 65535, found 70000",
            ),
            ("invalid type: integer `1`, expected a boolean", "expected true or false, found 1"),
            ("invalid type: floating point `1.5`, expected u32", "expected a number, found 1.5"),
            ("invalid type: boolean `true`, expected a string", "expected a string, found true"),
            ("invalid type: string \"a\", expected a sequence", "expected a list, found \"a\""),
            ("invalid type: sequence, expected struct Admin", "expected a table, found a list"),
            ("missing field `name`", "missing field `name`"),
            (
                "unknown variant `permit`, expected `allow` or `deny`",
                "unknown variant `permit`, expected `allow` or `deny`",
            ),
        ];
        for (serde, want) in table {
            assert_eq!(reword(serde), want);
        }
        let c = collect("n = \"x\"\n[[item]]\nname = 1\n");
        let messages: Vec<&str> = c.errors.iter().map(|(_, m)| m.as_str()).collect();
        assert!(messages.contains(&"expected a number, found \"x\""), "{messages:?}");
        assert!(messages.contains(&"expected a string, found 1"), "{messages:?}");
    }

    #[test]
    fn a_clean_document_has_no_errors() {
        let c = collect("n = 2\n[[item]]\nname = \"a\"\n");
        assert!(c.errors.is_empty() && c.unknown.is_empty());
        assert_eq!(c.value.n, 2);
        assert_eq!(c.removed.original(&path("item.0.name")), path("item.0.name"));
    }
}
