//! The external programs the tests drive (curl, ncat, squid, dante, openssl, ...), and what
//! a test does when one is missing: with `RUSTLE_REQUIRE_TOOLS=1` (`.ci/run` sets it) it
//! fails naming the program; without, it is skipped, says so on the terminal as it happens
//! (written past libtest's capture, which would hide a passing test's output), and the test
//! binary ends with the count: `rustle tests: 3 tests skipped for missing tools: ncat (2),
//! squid (1)`.
//!
//! libtest has no way to mark a test skipped once it runs, and no hook after the last test,
//! so the count is printed by a C `atexit` handler that the first skip registers: it runs
//! after libtest's own summary, whether the run passed or failed.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, Once};

/// The environment variable that turns a missing tool into a failure.
pub const REQUIRE_VAR: &str = "RUSTLE_REQUIRE_TOOLS";

/// Whether a missing tool fails the test (`RUSTLE_REQUIRE_TOOLS=1`).
pub fn required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1")
}

/// Whether `tool --version` starts (its exit status does not matter: some tools exit 1).
pub fn runs(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Where `program` is: on PATH, or at one of `also` (squid and danted are in /usr/sbin,
/// which is not on every user's PATH, and take no `--version`).
pub fn find(program: &str, also: &[&str]) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(program)).find(|p| p.is_file()))
        .or_else(|| also.iter().map(PathBuf::from).find(|p| p.is_file()))
}

/// The calling test needs `tool`: true when it runs; when it does not, the test fails
/// (`RUSTLE_REQUIRE_TOOLS=1`) or is counted as skipped and this returns false, and the
/// test returns without checking anything.
#[track_caller]
pub fn need(tool: &str) -> bool {
    runs(tool) || {
        missing(tool);
        false
    }
}

/// The calling test cannot run because `tool` (a program, or a file a program needs) is
/// missing: panics naming it with `RUSTLE_REQUIRE_TOOLS=1`, else counts the test as skipped
/// and says so.
#[track_caller]
pub fn missing(tool: &str) {
    assert!(
        !required(),
        "`{tool}` is not installed and {REQUIRE_VAR}=1: this test needs it (.ci/run installs it)"
    );
    record(Kind::Test, tool);
}

/// Part of the calling test needs `tool`, which `.ci/run` installs: whether it runs. A
/// missing one fails the test with `RUSTLE_REQUIRE_TOOLS=1`, and otherwise leaves the part
/// out, counted apart from the skipped tests.
#[track_caller]
pub fn part(tool: &str) -> bool {
    runs(tool) || {
        assert!(
            !required(),
            "`{tool}` is not installed and {REQUIRE_VAR}=1: part of this test needs it \
             (.ci/run installs it)"
        );
        record(Kind::Part, tool);
        false
    }
}

/// Part of the calling test needs `tool`, an extra check nobody is asked to install (a
/// linter): whether it runs. Never fails; a missing one is counted like `part`'s.
pub fn optional(tool: &str) -> bool {
    runs(tool) || {
        record(Kind::Part, tool);
        false
    }
}

/// The calling test cannot run on this host for a reason other than a missing tool (no
/// IPv6 loopback, not root, no address outside the private ranges): counted apart, never a
/// failure, since `.ci/run` cannot install it.
pub fn skip_host(reason: &str) {
    record(Kind::Host, reason);
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Test,
    Part,
    Host,
}

/// (kind, tool or reason, test): a test counts once per tool, however often it asks.
static SKIPS: Mutex<BTreeSet<(Kind, String, String)>> = Mutex::new(BTreeSet::new());

fn record(kind: Kind, what: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let line = match kind {
        Kind::Test => format!("SKIPPED {test}: `{what}` is not installed; this test needs it\n"),
        Kind::Part => format!("PART SKIPPED {test}: `{what}` is not installed\n"),
        Kind::Host => format!("SKIPPED {test}: {what}\n"),
    };
    // Straight to the file descriptor: libtest captures `eprintln!` of a passing test.
    let _ = std::io::stderr().write_all(line.as_bytes());
    SKIPS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert((
        kind,
        what.to_string(),
        test,
    ));
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: `report` is an `extern "C" fn()` with no arguments, as atexit wants; it
        // only reads a static and writes to stderr, and cannot unwind (no panicking calls).
        #[allow(unsafe_code)]
        let _ = unsafe { libc::atexit(report) };
    });
}

/// The summary lines for a set of skips, one per kind that has any.
fn summary(skips: &BTreeSet<(Kind, String, String)>) -> String {
    let mut out = String::new();
    for (kind, label) in [
        (Kind::Test, "skipped for missing tools"),
        (Kind::Part, "left out a part for missing tools"),
        (Kind::Host, "skipped for this host"),
    ] {
        let of_kind: Vec<_> = skips.iter().filter(|s| s.0 == kind).collect();
        if of_kind.is_empty() {
            continue;
        }
        let tests: BTreeSet<&str> = of_kind.iter().map(|s| s.2.as_str()).collect();
        let mut per: Vec<(&str, usize)> = Vec::new();
        for s in &of_kind {
            match per.last_mut() {
                Some((w, n)) if *w == s.1 => *n += 1,
                _ => per.push((&s.1, 1)),
            }
        }
        let per: Vec<String> = per.iter().map(|(w, n)| format!("{w} ({n})")).collect();
        let n = tests.len();
        let noun = if n == 1 { "test" } else { "tests" };
        out.push_str(&format!("rustle tests: {n} {noun} {label}: {}", per.join(", ")));
        if kind == Kind::Test {
            out.push_str(&format!(" ({REQUIRE_VAR}=1 makes them fail)"));
        }
        out.push('\n');
    }
    out
}

extern "C" fn report() {
    // try_lock: a test thread still running at exit may hold it; better no summary than a
    // hang.
    let Ok(skips) = SKIPS.try_lock() else { return };
    let _ = std::io::stderr().write_all(format!("\n{}", summary(&skips)).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_each_test_once_per_tool_and_kind() {
        let s = |k, w: &str, t: &str| (k, w.to_string(), t.to_string());
        let skips = BTreeSet::from([
            s(Kind::Test, "squid", "a"),
            s(Kind::Test, "squid", "b"),
            s(Kind::Test, "ncat", "a"),
            s(Kind::Part, "hadolint", "c"),
            s(Kind::Host, "no IPv6 loopback", "d"),
        ]);
        assert_eq!(
            summary(&skips),
            "rustle tests: 2 tests skipped for missing tools: ncat (1), squid (2) \
             (RUSTLE_REQUIRE_TOOLS=1 makes them fail)\n\
             rustle tests: 1 test left out a part for missing tools: hadolint (1)\n\
             rustle tests: 1 test skipped for this host: no IPv6 loopback (1)\n"
        );
        assert_eq!(summary(&BTreeSet::new()), "");
    }
}
