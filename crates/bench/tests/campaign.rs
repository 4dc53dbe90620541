//! The campaign's quick profile end to end (a few cells of a few families on loopback,
//! the CSV and the report written), so the harness cannot rot; the committed documents
//! checked against the committed data.
//! Uses the release rustle binary if there is one, else the debug one that
//! `cargo test --workspace` builds; a failure with `RUSTLE_REQUIRE_TOOLS=1`, and
//! otherwise skipped, when neither, or nginx, is there. Also: SIGTERM in the middle of a run leaves no scratch
//! directory behind. And `--help` of every command answers with its usage, status 0.

use std::path::PathBuf;
use std::process::Command;

fn rustle_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RUSTLE_BIN") {
        return Some(PathBuf::from(p));
    }
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
    ["release", "debug"].iter().map(|p| target.join(p).join("rustle")).find(|p| p.exists())
}

/// Whether `cmd` is installed (on PATH or in /usr/sbin); a missing one fails the test with
/// `RUSTLE_REQUIRE_TOOLS=1`, else skips it (`rustle_bench::tools`).
fn has(cmd: &str) -> bool {
    let found = rustle_bench::tools::find(cmd, &[&format!("/usr/sbin/{cmd}")]).is_some();
    if !found {
        rustle_bench::tools::missing(cmd);
    }
    found
}

#[test]
fn quick_profile_writes_csv_and_report() {
    let Some(rustle) = rustle_bin() else {
        rustle_bench::tools::missing(
            "the rustle binary (cargo build -p rustle, or set RUSTLE_BIN)",
        );
        return;
    };
    if !has("nginx") || !has("squid") || !has("danted") || !has("taskset") {
        return;
    }
    let out = std::env::temp_dir().join(format!("rustle-campaign-test-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_rustle-bench"))
        .args(["campaign", "--profile", "quick", "--out"])
        .arg(&out)
        .arg("--rustle-bin")
        .arg(&rustle)
        .status()
        .expect("running the campaign");
    assert!(status.success(), "quick profile failed; see {}", out.display());
    let csv = std::fs::read_to_string(out.join("runs.csv")).expect("runs.csv");
    // Every family of the quick profile ran rustle, and each row names its family.
    for f in rustle_bench::campaign::profile::FAMILIES {
        let Some(plan) = f.quick else { continue };
        let first = plan.scenarios.split(',').next().expect("a scenario");
        // `stage` is the last column but one (machine_cpu_s follows).
        let rustle = csv.lines().find(|l| {
            l.contains(&format!(",{first},rustle,1,")) && l.rsplit(',').nth(1) == Some(f.id)
        });
        let line = rustle.unwrap_or_else(|| panic!("{}: no rustle row\n{csv}", f.id));
        assert!(line.contains(",ok,"), "{line}");
    }
    let md = std::fs::read_to_string(out.join("REPORT.md")).expect("report");
    assert!(md.contains("## HTTP proxy") && md.contains("| http-ka-1k, req/s |"), "{md}");
    assert!(md.contains("## In short") && md.contains("| HTTP proxy | req/s"), "{md}");
    // The floor forwarder ran, and as a reference it never takes the star.
    assert!(csv.lines().any(|l| l.contains(",http-ka-1k,floor,1,") && l.contains(",ok,")), "{csv}");
    let header = md.lines().find(|l| l.starts_with("| scenario | rustle |")).expect("a table");
    let col = header.split('|').position(|c| c.trim() == "floor").expect("a floor column");
    for row in md.lines().filter(|l| l.starts_with("| http-ka-1k")) {
        assert!(!row.split('|').nth(col).unwrap_or("").contains('*'), "{row}");
    }
    for chart in ["http-req-per-s.svg", "tunnels-req-per-s.svg"] {
        assert!(out.join("charts").join(chart).exists(), "{chart}");
    }
    assert!(std::fs::read_to_string(out.join("conditions-http.txt"))
        .expect("conditions")
        .contains("loopback"));
    std::fs::remove_dir_all(&out).expect("cleaning up");
}

/// BENCHMARKS.md, its charts and the README's performance summary are what the report
/// generator makes of the newest committed data set (bench/data/YYYYMMDD/).
#[test]
fn committed_documents_are_what_the_data_gives() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let diffs = rustle_bench::report::document::check_documents(&root).expect("generating");
    assert!(
        diffs.is_empty(),
        "regenerate with `rustle-bench report --documents` from the repository's root:\n{}",
        diffs.join("\n")
    );
}

#[test]
fn sigterm_removes_the_scratch_directory() {
    let Some(rustle) = rustle_bin() else {
        rustle_bench::tools::missing(
            "the rustle binary (cargo build -p rustle, or set RUSTLE_BIN)",
        );
        return;
    };
    if !has("taskset") {
        return;
    }
    // A TMPDIR of its own (under /tmp), so that what is left is ours alone.
    let tmp = std::env::temp_dir().join(format!("rustle-campaign-sig-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rustle-bench"))
        .args(["campaign", "--scenarios", "http-ka-1k", "--proxies", "rustle", "--reps", "1"])
        .args(["--duration", "30s", "--netns", "off", "--out"])
        .arg(tmp.join("out"))
        .arg("--rustle-bin")
        .arg(&rustle)
        .env("TMPDIR", &tmp)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting the campaign");
    let scratch = tmp.join(format!("rustle-campaign-{}", child.id()));
    // Wait until a run is under way: the proxy started (its run directory exists) and the
    // load generator, a child of the campaign, runs against it.
    let pid = child.id();
    let load_runs = || {
        let mut tasks =
            std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
        tasks.any(|task| {
            let children = std::fs::read_to_string(task.path().join("children"));
            children.unwrap_or_default().split_whitespace().any(|c| {
                let cmdline = std::fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
                cmdline.split(|b| *b == 0).any(|arg| arg == b"load")
            })
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(scratch.join("run-1").exists() && load_runs()) {
        assert!(std::time::Instant::now() < deadline, "the campaign never started a run");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let killed = Command::new("kill").args(["-s", "TERM", &child.id().to_string()]).status();
    assert!(killed.expect("kill").success());
    let status = child.wait().expect("waiting for the campaign");
    assert_eq!(status.code(), Some(130));
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("reading tmp")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "out")
        .collect();
    assert!(left.is_empty(), "left behind in {}: {left:?}", tmp.display());
    std::fs::remove_dir_all(&tmp).expect("cleaning up");
}

#[test]
fn help_prints_the_usage_and_succeeds() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["help"],
        &["origin", "--help"],
        &["tcp-echo", "--help"],
        &["udp-echo", "--help"],
        &["floor", "--help"],
        &["load", "--help"],
        &["load", "-h"],
        &["campaign", "--help"],
        &["report", "--help"],
        &["cost", "--help"],
        &["auth-servers", "--help"],
        &["help", "load"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rustle-bench"))
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("run rustle-bench");
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "rustle-bench {args:?}: {}\n{err}", out.status);
        assert!(text.to_lowercase().contains("usage"), "rustle-bench {args:?}: {text}");
        assert!(!err.contains("backtrace"), "rustle-bench {args:?}: {err}");
    }
    // A mistyped command line: clap's message on standard error, status 2, no backtrace.
    let out = Command::new(env!("CARGO_BIN_EXE_rustle-bench"))
        .arg("--frobnicate")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run rustle-bench");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.to_lowercase().contains("usage") && !err.contains("Stack backtrace"), "{err}");
    // A failure past the command line: one line on standard error, status 1.
    let out = Command::new(env!("CARGO_BIN_EXE_rustle-bench"))
        .arg("auth-servers")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run rustle-bench");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("rustle-bench: ") && err.lines().count() == 1, "{err}");
}
