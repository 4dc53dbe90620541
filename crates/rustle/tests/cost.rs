//! The cost guard in `cargo test` (bench/README.md, "The cost guard"): builds the shipped
//! binaries (release profile), runs `rustle-bench cost` against the committed
//! `bench/cost-baseline.toml`, and checks that the last commit that changed the baseline
//! says why, in a line starting with `Cost:`. A test binary of its own, so that it runs
//! alone and no other test's traffic or CPU falls into its measurements.
//!
//! Without valgrind or strace it says SKIPPED, unless `RUSTLE_REQUIRE_TOOLS=1` (set by
//! `.ci/run`): then a missing tool fails it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

const BASELINE: &str = "bench/cost-baseline.toml";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// The target directory this test was built into (`<target>/debug/deps/cost-HASH`), where
/// the release binaries go too.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.ancestors().nth(3).expect("<target>/<profile>/deps/<test>").to_path_buf()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(root).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The rule that keeps the baseline honest: the commit that last changed it carries a
/// `Cost:` line saying why.
fn last_baseline_commit_says_why(root: &Path) {
    let Some(log) = git(root, &["log", "-1", "--format=%h %s%n%B", "--", BASELINE])
        .filter(|l| !l.trim().is_empty())
    else {
        eprintln!(
            "SKIPPED (commit check only): no git history of {BASELINE} here (not a git \
             checkout, git missing, or a shallow clone without that commit)"
        );
        return;
    };
    let (first, message) = log.split_once('\n').unwrap_or((&log, ""));
    assert!(
        message.lines().any(|l| l.trim_start().starts_with("Cost:")),
        "the last commit that changed {BASELINE} ({first}) has no line starting with \
         `Cost:`: a baseline is updated by a commit that says why (e.g. `Cost: the pool \
         keeps a buffer per connection`); amend or reword it"
    );
    if git(root, &["status", "--porcelain", "--", BASELINE]).is_some_and(|s| !s.is_empty()) {
        eprintln!("note: {BASELINE} has uncommitted changes; commit them with a `Cost:` line");
    }
}

#[test]
fn cost_per_exchange_and_memory_at_rest_stay_within_the_committed_baseline() {
    for tool in ["valgrind", "vgdb", "strace"] {
        if !rustle_bench::tools::need(tool) {
            return;
        }
    }
    let root = workspace_root();
    last_baseline_commit_says_why(&root);

    // The shipped binaries: the release profile, in this test's target directory (its lock
    // is the release profile's, not the debug one cargo test holds).
    let started = Instant::now();
    let target = target_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // rustle alone, as the Dockerfile and `cargo install` build it: built together with
    // rustle-bench, cargo would unify their dependencies' features (tokio's multi-thread
    // runtime) into a binary nobody ships.
    for package in ["rustle", "rustle-bench"] {
        let build = Command::new(&cargo)
            .args(["build", "--release", "--locked", "-p", package])
            .arg("--target-dir")
            .arg(&target)
            .current_dir(&root)
            .stdin(Stdio::null())
            .output()
            .expect("run cargo build --release");
        assert!(build.status.success(), "cargo build --release failed:\n{}", text(&build));
    }
    let built = started.elapsed();

    let release = target.join("release");
    let guard = Command::new(release.join("rustle-bench"))
        .arg("cost")
        .arg("--rustle")
        .arg(release.join("rustle"))
        .arg("--baseline")
        .arg(root.join(BASELINE))
        .current_dir(&root)
        .stdin(Stdio::null())
        .output()
        .expect("run rustle-bench cost");
    println!("{}", text(&guard));
    println!("release build {built:.0?}, cost guard {:.0?}", started.elapsed() - built);
    assert!(guard.status.success(), "the cost guard failed:\n{}", text(&guard));
}
