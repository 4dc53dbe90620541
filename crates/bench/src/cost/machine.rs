//! What the machine-dependent figures were measured on (see
//! [`super::baseline::Machine`]), and a few facts recorded with the baseline.

use std::path::Path;
use std::process::Command;

use super::baseline::Machine;

/// CPU features that choose code paths in what rustle runs: glibc's string
/// functions (ifuncs), aws-lc's assembly (AES, GHASH, SHA, big-number and
/// curve arithmetic), httparse's SIMD header scanning.
const FEATURES: [&str; 20] = [
    "adx",
    "aes",
    "avx",
    "avx2",
    "avx512bw",
    "avx512dq",
    "avx512f",
    "avx512ifma",
    "avx512vl",
    "bmi1",
    "bmi2",
    "erms",
    "fsrm",
    "movbe",
    "pclmulqdq",
    "sha_ni",
    "sse4_1",
    "sse4_2",
    "ssse3",
    "vaes",
];

/// This machine; `realtime`: whether the measured processes run under
/// real-time scheduling.
pub(super) fn here(realtime: bool) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.split_whitespace().collect())
        .unwrap_or_default();
    let cpu_features: Vec<&str> = FEATURES.into_iter().filter(|f| flags.contains(f)).collect();
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| Some(s[s.find('[')? + 1..s.find(']')?].to_string()))
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cpu_features: cpu_features.join(" "),
        glibc: output("getconf", &["GNU_LIBC_VERSION"]).replace("glibc ", ""),
        valgrind: output("valgrind", &["--version"]).replace("valgrind-", ""),
        thp,
        scheduling: if realtime { "fifo" } else { "other" }.into(),
    }
}

/// Facts recorded with a baseline for people: the CPU, the kernel, the
/// compiler that built `rustle`, strace, and the date.
pub(super) fn record(rustle: &Path) -> Vec<(&'static str, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown", |(_, m)| m.trim())
        .to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    vec![
        ("cpu_model", model),
        ("kernel", kernel.trim().to_string()),
        ("rustc", rustc_of(rustle)),
        ("strace", output("strace", &["-V"]).lines().next().unwrap_or("").to_string()),
        ("written", today()),
    ]
}

/// The first line a command prints, or "unknown".
fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// The compiler version rustc leaves in a binary's `.comment` section.
fn rustc_of(binary: &Path) -> String {
    let Ok(bytes) = std::fs::read(binary) else { return "unknown".into() };
    let needle = b"rustc version ";
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .and_then(|at| {
            let rest = &bytes[at + needle.len()..];
            let end = rest.iter().position(|&b| b == 0 || b == b')')?;
            Some(format!("{})", String::from_utf8_lossy(&rest[..end])))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Today's date (UTC), from the system clock: `YYYY-MM-DD`.
fn today() -> String {
    let (y, m, d) = crate::date::civil(crate::date::now_secs() / 86_400);
    format!("{y:04}-{m:02}-{d:02}")
}
