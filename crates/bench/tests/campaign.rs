//! The campaign's smoke mode end to end: rustle and nginx on loopback,
//! http-ka-1k for 2 s, the CSV and the report written, so the harness cannot rot.
//! Uses the release rustle binary if there is one, else the debug one that
//! `cargo test --workspace` builds; skipped (with a message) when neither, or
//! nginx, is there.

use std::path::PathBuf;
use std::process::Command;

fn rustle_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RUSTLE_BIN") {
        return Some(PathBuf::from(p));
    }
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
    ["release", "debug"].iter().map(|p| target.join(p).join("rustle")).find(|p| p.exists())
}

fn has(cmd: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .chain([PathBuf::from("/usr/sbin")])
            .any(|d| d.join(cmd).is_file())
    })
}

#[test]
fn smoke_campaign_writes_csv_and_report() {
    let Some(rustle) = rustle_bin() else {
        eprintln!("skipped: no rustle binary (cargo build -p rustle, or set RUSTLE_BIN)");
        return;
    };
    if !has("nginx") || !has("taskset") {
        eprintln!("skipped: nginx or taskset not installed");
        return;
    }
    let out = std::env::temp_dir().join(format!("rustle-campaign-test-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_rustle-bench"))
        .args(["campaign", "--smoke", "--out"])
        .arg(&out)
        .arg("--rustle-bin")
        .arg(&rustle)
        .status()
        .expect("running the campaign");
    assert!(status.success(), "smoke campaign failed; see {}", out.display());
    let csv = std::fs::read_to_string(out.join("runs.csv")).expect("runs.csv");
    assert!(csv.lines().any(|l| l.contains(",http-ka-1k,rustle,1,") && l.contains(",ok,")));
    let md = std::fs::read_to_string(out.join("BENCHMARKS.md")).expect("report");
    assert!(md.contains("| http-ka-1k, req/s |"), "{md}");
    assert!(std::fs::read_to_string(out.join("conditions.txt"))
        .expect("conditions")
        .contains("loopback"));
    std::fs::remove_dir_all(&out).expect("cleaning up");
}
