//! The committed baseline of the cost guard and the verdict against it: no
//! I/O here, so that reading, writing and judging are unit-tested.
//!
//! A figure is named `group.figure` (`http-keepalive.instructions`,
//! `memory.idle_anon_kib`). It fails when it is above
//! `baseline × (1 + relative) + absolute`; the tolerance is 2 % relative
//! unless the file's `[tolerance]` table names the figure (`group.figure`)
//! or its kind (`allocations`), with the reason. Figures that depend on the
//! machine (see [`Machine`]) are judged only where the machine matches.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Context, Result};

/// The relative tolerance of a figure the baseline gives none.
pub(super) const DEFAULT_RELATIVE: f64 = 0.02;

/// What the figures that depend on the machine were measured on.
/// Instructions depend on the code paths picked at run time by CPU features
/// (glibc's string functions, aws-lc, httparse), on glibc and valgrind, and
/// on how the measured processes were scheduled, as are the waits in
/// `epoll_wait`; resident memory on glibc's
/// allocator and the kernel's transparent huge pages. Allocations and system
/// calls depend on rustle's code only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Machine {
    /// The CPU features those libraries choose code paths by, sorted.
    pub cpu_features: String,
    pub glibc: String,
    pub valgrind: String,
    /// `/sys/kernel/mm/transparent_hugepage/enabled`, the chosen mode.
    pub thp: String,
    /// `fifo` when rustle and its peers ran under real-time scheduling,
    /// `other` when they could not (see `cost::isolate`).
    pub scheduling: String,
}

impl Machine {
    /// The fields that differ from `other`'s, for the report.
    pub fn differences(&self, other: &Machine) -> Vec<String> {
        let mut d = Vec::new();
        let pairs = [
            ("cpu_features", &self.cpu_features, &other.cpu_features),
            ("glibc", &self.glibc, &other.glibc),
            ("valgrind", &self.valgrind, &other.valgrind),
            ("thp", &self.thp, &other.thp),
            ("scheduling", &self.scheduling, &other.scheduling),
        ];
        for (name, a, b) in pairs {
            if a != b {
                d.push(format!("{name}: {a:?} here, {b:?} in the baseline"));
            }
        }
        d
    }
}

/// Whether a figure's value depends on the machine (see [`Machine`]).
pub(super) fn machine_dependent(key: &str) -> bool {
    key.ends_with(".instructions") || key.ends_with(".waits") || key.starts_with("memory.")
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tolerance {
    pub relative: f64,
    pub absolute: f64,
    pub why: String,
}

/// A parsed baseline file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Baseline {
    /// `group.figure` → value, in file order within each group.
    pub figures: Vec<(String, f64)>,
    /// Keyed by `group.figure` or by a figure's kind (the part after the dot).
    pub tolerances: BTreeMap<String, Tolerance>,
    pub machine: Machine,
}

impl Baseline {
    pub fn get(&self, key: &str) -> Option<f64> {
        self.figures.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The tolerance of `key`: its own, else its kind's, else 2 % relative.
    pub fn tolerance(&self, key: &str) -> Tolerance {
        let kind = key.rsplit_once('.').map_or(key, |(_, k)| k);
        self.tolerances
            .get(key)
            .or_else(|| self.tolerances.get(kind))
            .cloned()
            .unwrap_or(Tolerance { relative: DEFAULT_RELATIVE, absolute: 0.0, why: String::new() })
    }

    /// Reads the file's text.
    pub fn parse(text: &str) -> Result<Baseline> {
        let table: toml::Table = text.parse().context("the baseline is not valid TOML")?;
        let mut b = Baseline::default();
        for (group, value) in &table {
            let Some(t) = value.as_table() else { bail!("{group}: expected a table") };
            match group.as_str() {
                "machine" => {
                    let s = |k: &str| t.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
                    b.machine = Machine {
                        cpu_features: s("cpu_features"),
                        glibc: s("glibc"),
                        valgrind: s("valgrind"),
                        thp: s("thp"),
                        scheduling: s("scheduling"),
                    };
                }
                "tolerance" => {
                    for (key, v) in t {
                        let Some(v) = v.as_table() else {
                            bail!("tolerance.{key}: expected a table")
                        };
                        let num = |k: &str| -> Result<f64> {
                            match v.get(k) {
                                None => Ok(0.0),
                                Some(x) => {
                                    number(x).with_context(|| format!("tolerance.{key}.{k}"))
                                }
                            }
                        };
                        let why = v.get("why").and_then(|w| w.as_str()).unwrap_or("");
                        if why.trim().is_empty() {
                            bail!(
                                "tolerance.{key}: says no `why`; every tolerance gives its reason"
                            );
                        }
                        let relative = match v.get("relative") {
                            None => DEFAULT_RELATIVE,
                            Some(_) => num("relative")?,
                        };
                        let tol =
                            Tolerance { relative, absolute: num("absolute")?, why: why.into() };
                        b.tolerances.insert(key.clone(), tol);
                    }
                }
                _ => {
                    for (name, v) in t {
                        let key = format!("{group}.{name}");
                        let v = number(v).with_context(|| key.clone())?;
                        b.figures.push((key, v));
                    }
                }
            }
        }
        Ok(b)
    }
}

fn number(v: &toml::Value) -> Result<f64> {
    match v {
        toml::Value::Integer(i) => Ok(*i as f64),
        toml::Value::Float(f) => Ok(*f),
        other => bail!("expected a number, found {other}"),
    }
}

/// How one figure compares with its baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Within its tolerance.
    Within,
    /// Below the baseline by more than its tolerance: the baseline could be lowered.
    Lower,
    /// Above the baseline by more than its tolerance: the guard fails.
    Higher,
    /// Measured, with no baseline figure: the guard fails until it is written.
    New,
    /// In the baseline, not measured: the guard fails (a stale baseline).
    Gone,
    /// Machine-dependent and this machine is not the baseline's: not judged.
    NotCompared,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub key: String,
    pub baseline: Option<f64>,
    pub measured: Option<f64>,
    /// The highest value that passes.
    pub limit: Option<f64>,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub lines: Vec<Line>,
    /// Why machine-dependent figures were not judged (empty when they were).
    pub machine_differences: Vec<String>,
}

impl Verdict {
    pub fn failed(&self) -> bool {
        self.lines
            .iter()
            .any(|l| matches!(l.outcome, Outcome::Higher | Outcome::New | Outcome::Gone))
    }

    /// The comparison table and what to do, for people.
    pub fn render(&self, baseline_path: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<30} {:>12} {:>12} {:>7}  verdict",
            "figure", "baseline", "measured", "ratio"
        );
        for l in &self.lines {
            let ratio = match (l.baseline, l.measured) {
                (Some(b), Some(m)) if b > 0.0 => format!("{:.3}", m / b),
                _ => "-".into(),
            };
            let verdict = match l.outcome {
                Outcome::Within => "ok".to_string(),
                Outcome::Lower => "lower: the baseline could be lowered".to_string(),
                Outcome::Higher => format!("FAIL: above {}", show(l.limit.unwrap_or_default())),
                Outcome::New => "FAIL: not in the baseline".to_string(),
                Outcome::Gone => "FAIL: in the baseline, not measured".to_string(),
                Outcome::NotCompared => "not compared (another machine)".to_string(),
            };
            let cell = |v: Option<f64>| v.map(show).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "{:<30} {:>12} {:>12} {:>7}  {}",
                l.key,
                cell(l.baseline),
                cell(l.measured),
                ratio,
                verdict
            );
        }
        if !self.machine_differences.is_empty() {
            let _ = writeln!(
                s,
                "instructions, waits and memory not compared: this machine is not the \
                 baseline's ({})",
                self.machine_differences.join("; ")
            );
        }
        if self.failed() {
            let _ = writeln!(
                s,
                "cost guard FAILED. If the change in cost is meant: run \
                 `target/release/rustle-bench cost --write` (after `cargo build --release -p rustle` \
                 and `cargo build --release -p rustle-bench`, rustle built alone as it ships) and \
                 commit {baseline_path} with a commit message line `Cost: <why>`."
            );
        } else if self.lines.iter().any(|l| l.outcome == Outcome::Lower) {
            let _ = writeln!(
                s,
                "cost guard passed; some figures are lower than the baseline: \
                 `rustle-bench cost --write` and a `Cost:` line would record the gain."
            );
        } else {
            let _ = writeln!(s, "cost guard passed.");
        }
        s
    }
}

/// A figure as the file and the tables show it: integers without decimals,
/// smaller figures to three decimals.
pub(super) fn show(v: f64) -> String {
    if v.fract() == 0.0 || v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// Judges `measured` (in its order) against `base`. `only`: the groups
/// measured, when not all were (a baseline figure outside them is not
/// "gone").
pub fn compare(
    base: &Baseline,
    measured: &[(String, f64)],
    here: &Machine,
    only: Option<&[String]>,
) -> Verdict {
    let machine_differences = here.differences(&base.machine);
    let mut lines = Vec::new();
    for (key, m) in measured {
        let m = *m;
        let Some(b) = base.get(key) else {
            lines.push(Line {
                key: key.clone(),
                baseline: None,
                measured: Some(m),
                limit: None,
                outcome: Outcome::New,
            });
            continue;
        };
        let t = base.tolerance(key);
        let limit = b * (1.0 + t.relative) + t.absolute;
        let floor = b * (1.0 - t.relative) - t.absolute;
        let outcome = if !machine_differences.is_empty() && machine_dependent(key) {
            Outcome::NotCompared
        } else if m > limit {
            Outcome::Higher
        } else if m < floor {
            Outcome::Lower
        } else {
            Outcome::Within
        };
        lines.push(Line {
            key: key.clone(),
            baseline: Some(b),
            measured: Some(m),
            limit: Some(limit),
            outcome,
        });
    }
    for (key, b) in &base.figures {
        let group = key.split_once('.').map_or(key.as_str(), |(g, _)| g);
        let in_scope = only.is_none_or(|o| o.iter().any(|g| g == group));
        if in_scope && !measured.iter().any(|(k, _)| k == key) {
            lines.push(Line {
                key: key.clone(),
                baseline: Some(*b),
                measured: None,
                limit: None,
                outcome: Outcome::Gone,
            });
        }
    }
    Verdict { lines, machine_differences }
}

/// One group of figures for the file: its name, a comment line saying what
/// it is, and its figures.
pub(super) struct Group<'a> {
    pub name: &'a str,
    pub comment: String,
    pub figures: Vec<(&'a str, f64)>,
}

/// The baseline file's text: `header` (comment lines, `# ` included), the
/// machine with `informational` fields after it, the groups, and the
/// tolerances.
pub(super) fn write(
    header: &str,
    machine: &Machine,
    informational: &[(&str, String)],
    groups: &[Group<'_>],
    tolerances: &BTreeMap<String, Tolerance>,
) -> String {
    let mut s = String::new();
    s.push_str(header);
    s.push_str("\n[machine]\n");
    s.push_str(
        "# Instructions, waits and memory are compared only where these five values are the\n\
         # same: they choose the code paths glibc, aws-lc and httparse run (CPU features), the\n\
         # allocator and the instrumentation, how pages are backed, and whether rustle and its\n\
         # peers ran under real-time scheduling. Elsewhere allocations and system calls are\n\
         # still compared.\n",
    );
    for (k, v) in [
        ("cpu_features", &machine.cpu_features),
        ("glibc", &machine.glibc),
        ("valgrind", &machine.valgrind),
        ("thp", &machine.thp),
        ("scheduling", &machine.scheduling),
    ] {
        let _ = writeln!(s, "{k} = {}", quote(v));
    }
    s.push_str("# For the record only:\n");
    for (k, v) in informational {
        let _ = writeln!(s, "{k} = {}", quote(v));
    }
    for g in groups {
        let _ = write!(s, "\n[{}]\n{}", g.name, comment(&g.comment));
        for (k, v) in &g.figures {
            let _ = writeln!(s, "{k} = {}", show(*v));
        }
    }
    if !tolerances.is_empty() {
        s.push_str(
            "\n# Figures (`group.figure`) or kinds of figure (`allocations`) with a tolerance of\n\
             # their own: a figure fails above baseline × (1 + relative) + absolute.\n[tolerance]\n",
        );
        for (k, t) in tolerances {
            let _ = writeln!(
                s,
                "{} = {{ relative = {}, absolute = {}, why = {} }}",
                quote_key(k),
                show(t.relative),
                show(t.absolute),
                quote(&t.why)
            );
        }
    }
    s
}

/// `text` as comment lines of at most 92 columns.
fn comment(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.len() + 1 + word.len() > 92 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn quote_key(k: &str) -> String {
    if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        k.to_string()
    } else {
        quote(k)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn machine() -> Machine {
        Machine {
            cpu_features: "avx2 sse4_2".into(),
            glibc: "2.36".into(),
            valgrind: "3.19.0".into(),
            thp: "madvise".into(),
            scheduling: "fifo".into(),
        }
    }

    fn tolerances() -> BTreeMap<String, Tolerance> {
        let mut t = BTreeMap::new();
        t.insert(
            "allocations".to_string(),
            Tolerance { relative: 0.02, absolute: 0.05, why: "rare allocations".into() },
        );
        t.insert(
            "memory.per_idle_client_bytes".to_string(),
            Tolerance { relative: 0.05, absolute: 0.0, why: "allocator \"timing\"".into() },
        );
        t
    }

    fn sample() -> String {
        let groups = [
            Group {
                name: "http-keepalive",
                comment: "kept-alive HTTP".into(),
                figures: vec![
                    ("instructions", 15780.0),
                    ("allocations", 0.003),
                    ("syscalls", 6.078),
                ],
            },
            Group {
                name: "memory",
                comment: "at rest".into(),
                figures: vec![("idle_anon_kib", 8300.0), ("per_idle_client_bytes", 5420.0)],
            },
        ];
        write("# header\n", &machine(), &[("written", "2026-12-02".into())], &groups, &tolerances())
    }

    #[test]
    fn writes_what_it_parses() {
        let text = sample();
        let b = Baseline::parse(&text).unwrap();
        assert_eq!(b.machine, machine());
        assert_eq!(b.get("http-keepalive.instructions"), Some(15780.0));
        assert_eq!(b.get("http-keepalive.allocations"), Some(0.003));
        assert_eq!(b.get("http-keepalive.syscalls"), Some(6.078));
        assert_eq!(b.get("memory.idle_anon_kib"), Some(8300.0));
        assert_eq!(b.figures.len(), 5);
        assert_eq!(b.tolerances, tolerances());
        assert!(text.contains("instructions = 15780\n"), "{text}");
        assert!(text.starts_with("# header\n"));
    }

    #[test]
    fn comments_are_wrapped() {
        let text = "word ".repeat(40);
        let c = comment(&text);
        assert!(c.lines().all(|l| l.starts_with("# ") && l.len() <= 92), "{c}");
        assert_eq!(c.split_whitespace().filter(|w| *w == "word").count(), 40);
    }

    #[test]
    fn tolerance_by_figure_then_kind_then_default() {
        let b = Baseline::parse(&sample()).unwrap();
        assert_eq!(b.tolerance("connect.allocations").absolute, 0.05);
        assert_eq!(b.tolerance("memory.per_idle_client_bytes").relative, 0.05);
        let d = b.tolerance("connect.syscalls");
        assert_eq!((d.relative, d.absolute), (DEFAULT_RELATIVE, 0.0));
    }

    #[test]
    fn a_tolerance_without_a_reason_is_refused() {
        let text = "[tolerance]\nsyscalls = { relative = 0.05 }\n";
        let e = Baseline::parse(text).unwrap_err();
        assert!(format!("{e:#}").contains("why"), "{e:#}");
        assert!(Baseline::parse("[a]\nx = \"1\"\n").is_err());
        assert!(Baseline::parse("not toml").is_err());
    }

    fn verdict(measured: &[(&str, f64)], here: &Machine) -> Verdict {
        let b = Baseline::parse(&sample()).unwrap();
        let m: Vec<(String, f64)> = measured.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let groups = ["http-keepalive".to_string(), "memory".to_string()];
        compare(&b, &m, here, Some(&groups))
    }

    fn outcome(v: &Verdict, key: &str) -> Outcome {
        v.lines.iter().find(|l| l.key == key).unwrap().outcome
    }

    const ALL_AT_BASELINE: [(&str, f64); 5] = [
        ("http-keepalive.instructions", 15780.0),
        ("http-keepalive.allocations", 0.003),
        ("http-keepalive.syscalls", 6.078),
        ("memory.idle_anon_kib", 8300.0),
        ("memory.per_idle_client_bytes", 5420.0),
    ];

    #[test]
    fn two_percent_above_passes_and_more_fails() {
        let v = verdict(&ALL_AT_BASELINE, &machine());
        assert!(!v.failed(), "{}", v.render("b.toml"));
        assert!(v.render("b.toml").contains("cost guard passed."));
        let mut m = ALL_AT_BASELINE;
        m[0].1 = 15780.0 * 1.019;
        assert!(!verdict(&m, &machine()).failed());
        m[0].1 = 15780.0 * 1.021;
        let v = verdict(&m, &machine());
        assert!(v.failed());
        assert_eq!(outcome(&v, "http-keepalive.instructions"), Outcome::Higher);
        let text = v.render("bench/cost-baseline.toml");
        assert!(text.contains("FAIL: above 16096"), "{text}");
        assert!(text.contains("rustle-bench cost --write"), "{text}");
        assert!(text.contains("`Cost: <why>`"), "{text}");
    }

    #[test]
    fn an_added_allocation_per_exchange_fails_and_a_rare_one_does_not() {
        let mut m = ALL_AT_BASELINE;
        m[1].1 = 0.003 + 0.04;
        assert!(!verdict(&m, &machine()).failed());
        m[1].1 = 1.003;
        let v = verdict(&m, &machine());
        assert_eq!(outcome(&v, "http-keepalive.allocations"), Outcome::Higher);
    }

    #[test]
    fn lower_figures_pass_and_say_so() {
        let mut m = ALL_AT_BASELINE;
        m[2].1 = 5.0;
        let v = verdict(&m, &machine());
        assert!(!v.failed());
        assert_eq!(outcome(&v, "http-keepalive.syscalls"), Outcome::Lower);
        assert!(v.render("b").contains("could be lowered"));
    }

    #[test]
    fn new_and_missing_figures_fail() {
        let mut m = ALL_AT_BASELINE.to_vec();
        m.push(("h2-stream.syscalls", 9.0));
        m.retain(|(k, _)| *k != "memory.idle_anon_kib");
        let v = verdict(&m, &machine());
        assert!(v.failed());
        assert_eq!(outcome(&v, "h2-stream.syscalls"), Outcome::New);
        assert_eq!(outcome(&v, "memory.idle_anon_kib"), Outcome::Gone);
        // A group not measured (a run with --only) is not missing.
        let b = Baseline::parse(&sample()).unwrap();
        let only = ["http-keepalive".to_string()];
        let m: Vec<(String, f64)> =
            ALL_AT_BASELINE[..3].iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert!(!compare(&b, &m, &machine(), Some(&only)).failed());
    }

    #[test]
    fn another_machine_judges_only_what_does_not_depend_on_it() {
        let mut other = machine();
        other.cpu_features = "sse4_2".into();
        let mut m = ALL_AT_BASELINE;
        m[0].1 *= 1.5;
        m[3].1 *= 1.5;
        let v = verdict(&m, &other);
        assert!(!v.failed(), "{}", v.render("b"));
        assert_eq!(outcome(&v, "http-keepalive.instructions"), Outcome::NotCompared);
        assert_eq!(outcome(&v, "memory.idle_anon_kib"), Outcome::NotCompared);
        assert!(v.render("b").contains("cpu_features"));
        assert!(machine_dependent("connect.waits") && !machine_dependent("connect.syscalls"));
        m[1].1 = 1.003;
        assert!(verdict(&m, &other).failed());
    }
}
