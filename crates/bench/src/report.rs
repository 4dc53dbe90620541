//! `rustle-bench report`: turns a campaign directory (runs.csv and
//! conditions.txt) into markdown tables and SVG charts.
//!
//! Every cell is the median of the repetitions of one scenario × proxy.
//! `*` marks the best of a row (highest throughput, lowest CPU, memory or
//! 99th percentile; ties all marked), `‡` a cell whose runs were mostly
//! paced by the client or the origin rather than by the proxy, `–` a cell
//! not measured, with its reason.
//!
//! A scenario run at several connection counts (`campaign --sweep`) has a
//! row per level in every table, labelled `scenario@N`, and a section of its
//! own with each proxy's best clean level (`sweep`).
//!
//! Submodules: [`stats`] (medians, best-of-row, pace rule), `table`
//! (markdown), `svg` (plotters), `charts` (which charts), `sweep` (the
//! concurrency sweep: best clean level, its table and chart).

mod charts;
pub mod document;
pub mod stats;
mod svg;
mod sweep;
mod table;
mod tls;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::campaign::record::{self, Row, Status};
use stats::{best_of_row, client_paced, median, Better};
use table::{num, Cell};

/// Markdown tables and SVG charts from a campaign directory (runs.csv, conditions.txt).
///
/// Every cell is the median of the repetitions of one scenario × proxy.
#[derive(clap::Parser, Debug)]
#[command(name = "report", args_override_self = true)]
pub struct Args {
    /// Regenerate BENCHMARKS.md, bench/charts/ and the README's performance summary from
    /// the newest data set in bench/data/ (run from the repository's root).
    #[arg(long, conflicts_with_all = ["input", "check"])]
    pub documents: bool,
    /// Check that BENCHMARKS.md, bench/charts/ and the README's summary are what the newest
    /// data set gives; fails naming the first difference.
    #[arg(long, conflicts_with = "input")]
    pub check: bool,
    /// A campaign directory (runs.csv, conditions.txt).
    #[arg(long = "in", value_name = "DIR", required_unless_present_any = ["documents", "check"])]
    pub input: Option<PathBuf>,
    /// The markdown to write [default: DIR/report.md].
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Where the charts go, linked relative to --out [default: DIR/svg].
    #[arg(long, value_name = "DIR")]
    pub svg_dir: Option<PathBuf>,
    /// Markdown included after the title (findings, caveats).
    #[arg(long, value_name = "FILE")]
    pub notes: Option<PathBuf>,
}

pub fn main(args: Args) -> Result<()> {
    let root = Path::new(".");
    if args.documents {
        for f in document::write_documents(root)? {
            println!("wrote {}", f.display());
        }
        return Ok(());
    }
    if args.check {
        let diffs = document::check_documents(root)?;
        if !diffs.is_empty() {
            bail!("the documents differ from the data: {}", diffs.join("; "));
        }
        println!("BENCHMARKS.md, bench/charts/ and the README summary match the data");
        return Ok(());
    }
    let Some(input) = args.input else { bail!("--in DIR is required") };
    let out = args.out.unwrap_or_else(|| input.join("report.md"));
    let notes = args.notes.map(std::fs::read_to_string).transpose().context("reading --notes")?;
    write_with(&input, &out, args.svg_dir.as_deref(), notes.as_deref())
}

/// Writes the report of `input` to `out`, charts into `svg_dir`.
pub fn write(input: &Path, out: &Path, svg_dir: Option<&Path>) -> Result<()> {
    write_with(input, out, svg_dir, None)
}

fn write_with(input: &Path, out: &Path, svg_dir: Option<&Path>, notes: Option<&str>) -> Result<()> {
    let rows = record::read(&input.join("runs.csv"))?;
    let conditions = std::fs::read_to_string(input.join("conditions.txt")).unwrap_or_default();
    let svg_dir = svg_dir.map_or_else(|| input.join("svg"), Path::to_path_buf);
    std::fs::create_dir_all(&svg_dir)?;
    let grid = Grid::new(&rows);
    let mut charts = sweep::charts(&grid, &svg_dir)?;
    charts.extend(charts::draw(&grid, &svg_dir)?);
    charts.extend(tls::charts(&grid, &svg_dir)?);
    let md_dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut md = render(&grid, &conditions, notes);
    md.push_str("\n## Charts\n\n");
    for (title, file) in charts {
        md.push_str(&format!("![{title}]({})\n\n", relative(&file, md_dir).display()));
    }
    std::fs::write(out, md).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// `file` relative to `dir` when it lies below it (the usual layout), else as given.
fn relative(file: &Path, dir: &Path) -> PathBuf {
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    abs(file).strip_prefix(abs(dir)).map(Path::to_path_buf).unwrap_or_else(|_| file.to_path_buf())
}

/// A scenario run at several connection counts: its levels, ascending,
/// each with the label of its row in the grid (`scenario@N`).
pub(crate) struct Swept {
    pub scenario: String,
    pub levels: Vec<(u32, String)>,
}

/// The runs grouped by scenario × proxy, in the order they first appear;
/// a swept scenario is one grid scenario per level, its levels ascending.
pub(crate) struct Grid<'a> {
    pub scenarios: Vec<String>,
    pub proxies: Vec<String>,
    pub swept: Vec<Swept>,
    cells: BTreeMap<(String, String), Vec<&'a Row>>,
}

impl<'a> Grid<'a> {
    fn new(rows: &'a [Row]) -> Grid<'a> {
        let (mut order, mut proxies) = (Vec::<&str>::new(), Vec::new());
        let mut levels: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for r in rows {
            if !order.contains(&r.scenario.as_str()) {
                order.push(&r.scenario);
            }
            if !proxies.contains(&r.proxy) {
                proxies.push(r.proxy.clone());
            }
            let l = levels.entry(&r.scenario).or_default();
            if let Some(n) = r.connections.filter(|n| !l.contains(n)) {
                l.push(n);
            }
        }
        let is_swept = |s: &str| levels.get(s).is_some_and(|l| l.len() > 1);
        let label = |r: &Row| match r.connections {
            Some(n) if is_swept(&r.scenario) => format!("{}@{n}", r.scenario),
            _ => r.scenario.clone(),
        };
        let mut cells: BTreeMap<_, Vec<&Row>> = BTreeMap::new();
        for r in rows {
            cells.entry((label(r), r.proxy.clone())).or_default().push(r);
        }
        let (mut scenarios, mut swept) = (Vec::new(), Vec::new());
        for s in order {
            let mut l = levels.get(s).cloned().unwrap_or_default();
            if l.len() < 2 {
                scenarios.push(s.to_string());
                continue;
            }
            l.sort_unstable();
            let l: Vec<(u32, String)> = l.into_iter().map(|n| (n, format!("{s}@{n}"))).collect();
            scenarios.extend(l.iter().map(|(_, label)| label.clone()));
            // Rows of the scenario without a count (hand-made CSVs) keep the bare name.
            if rows.iter().any(|r| r.scenario == s && r.connections.is_none()) {
                scenarios.push(s.to_string());
            }
            swept.push(Swept { scenario: s.to_string(), levels: l });
        }
        Grid { scenarios, proxies, swept, cells }
    }

    pub(crate) fn runs(&self, scenario: &str, proxy: &str) -> &[&'a Row] {
        self.cells.get(&(scenario.to_string(), proxy.to_string())).map_or(&[], Vec::as_slice)
    }

    /// Runs that measured something: a run in which every exchange failed
    /// has no throughput or latency worth a median (its errors are listed).
    pub(crate) fn ok(&self, scenario: &str, proxy: &str) -> Vec<&'a Row> {
        let measured = |r: &&Row| r.status == Status::Ok && r.completed != Some(0);
        self.runs(scenario, proxy).iter().copied().filter(measured).collect()
    }

    /// Median of one field over the measured runs.
    pub(crate) fn median(
        &self,
        scenario: &str,
        proxy: &str,
        f: impl Fn(&Row) -> Option<f64>,
    ) -> Option<f64> {
        let v: Vec<f64> = self.ok(scenario, proxy).into_iter().filter_map(f).collect();
        median(&v)
    }

    pub(crate) fn unit(&self, scenario: &str) -> String {
        self.cells
            .iter()
            .filter(|((s, _), _)| s == scenario)
            .flat_map(|(_, v)| v.iter())
            .find(|r| !r.unit.is_empty())
            .map_or(String::new(), |r| r.unit.clone())
    }

    /// Why a cell has no number: the first run's reason.
    fn empty(&self, scenario: &str, proxy: &str) -> Cell {
        let runs = self.runs(scenario, proxy);
        let failed = runs.iter().any(|r| r.status == Status::Ok && r.completed == Some(0));
        let reason = match runs.iter().find(|r| !r.reason.is_empty()) {
            Some(r) => r.reason.as_str(),
            None if failed => "every exchange failed",
            None => "",
        };
        // "start failed: <detail>" shows as "start failed"; the CSV keeps the rest.
        Cell::Empty(reason.split(':').next().unwrap_or("").to_string())
    }

    /// A row of cells for `scenario`: `value` picks the number ranked by
    /// `better`, `text` formats the cell.
    fn row(
        &self,
        scenario: &str,
        better: Better,
        value: &dyn Fn(&Row) -> Option<f64>,
        text: &dyn Fn(&str, f64) -> String,
    ) -> Vec<Cell> {
        let meds: Vec<Option<f64>> =
            self.proxies.iter().map(|p| self.median(scenario, p, value)).collect();
        // The floor is a reference, not a contender: it never takes the star.
        let contenders: Vec<Option<f64>> = self
            .proxies
            .iter()
            .zip(&meds)
            .map(|(p, m)| if p == FLOOR { None } else { *m })
            .collect();
        let best = best_of_row(&contenders, better);
        self.proxies
            .iter()
            .zip(meds.iter().zip(best))
            .map(|(p, (m, b))| match m {
                Some(v) => {
                    let paces: Vec<_> =
                        self.ok(scenario, p).iter().filter_map(|r| r.pace).collect();
                    Cell::Value { text: text(p, *v), best: b, client_paced: client_paced(&paces) }
                }
                None => self.empty(scenario, p),
            })
            .collect()
    }
}

impl Grid<'_> {
    /// Throughput rows, labelled with the unit.
    pub(in crate::report) fn throughput_rows(
        &self,
        scenarios: &[&String],
    ) -> Vec<(String, Vec<Cell>)> {
        let plain = |_: &str, v: f64| num(v);
        scenarios
            .iter()
            .map(|s| {
                let label = format!("{s}, {}", self.unit(s));
                (label, self.row(s, Better::Higher, &|r| r.throughput, &plain))
            })
            .collect()
    }

    /// The proxy's CPU per request, or per gigabyte for the streams.
    pub(in crate::report) fn cpu_rows(&self, scenarios: &[&String]) -> Vec<(String, Vec<Cell>)> {
        let plain = |_: &str, v: f64| num(v);
        scenarios
            .iter()
            .map(|s| {
                let gb = self.unit(s) == "Gbit/s";
                let (label, f): (String, fn(&Row) -> Option<f64>) = if gb {
                    (format!("{s}, s/GB"), |r| r.cpu_s_per_gb)
                } else {
                    (format!("{s}, µs/req"), |r| r.cpu_us_per_req)
                };
                (label, self.row(s, Better::Lower, &f, &plain))
            })
            .collect()
    }

    /// 50th / 99th / 99.9th percentiles in ms, ranked on the 99th.
    pub(in crate::report) fn latency_rows(
        &self,
        scenarios: &[&String],
    ) -> Vec<(String, Vec<Cell>)> {
        let ms = |us: Option<f64>| us.map_or("?".to_string(), |v| num(v / 1000.0));
        scenarios
            .iter()
            .map(|s| {
                let text = |p: &str, _: f64| {
                    let f = |get: fn(&Row) -> Option<u64>| {
                        ms(self.median(s, p, |r| get(r).map(|v| v as f64)))
                    };
                    format!(
                        "{} / {} / {}",
                        f(|r| r.lat_p50_us),
                        f(|r| r.lat_p99_us),
                        f(|r| r.lat_p99_9_us)
                    )
                };
                let p99 = |r: &Row| r.lat_p99_us.map(|v| v as f64);
                (s.to_string(), self.row(s, Better::Lower, &p99, &text))
            })
            .collect()
    }

    /// A memory figure (lower is better) divided by `scale`, with the
    /// tunnels held in brackets.
    pub(in crate::report) fn held_rows(
        &self,
        scenarios: &[&String],
        value: fn(&Row) -> Option<f64>,
        scale: f64,
    ) -> Vec<(String, Vec<Cell>)> {
        scenarios
            .iter()
            .map(|s| {
                let text = |p: &str, v: f64| {
                    let held = self.median(s, p, |r| r.tunnels_held.map(|h| h as f64));
                    format!("{} ({})", num(v / scale), held.map_or("?".into(), num))
                };
                (s.to_string(), self.row(s, Better::Lower, &value, &text))
            })
            .collect()
    }
}

/// `rustle-bench floor`, the bare forwarder: shown, never ranked.
const FLOOR: &str = "floor";

/// Whether the floor does the same network work as the proxies in `scenario`:
/// not on bulk streams (measured per GB), and not with a new HTTP connection
/// per request, where the proxies pool origin connections and the floor cannot.
fn floor_comparable(scenario: &str, unit: &str) -> bool {
    unit != "Gbit/s" && !(scenario.starts_with("http-") && scenario.contains("close"))
}

fn is_hold(unit: &str) -> bool {
    unit == "KB/tunnel"
}

fn render(g: &Grid, conditions: &str, notes: Option<&str>) -> String {
    let mut md = String::from("# Benchmarks\n\n");
    if let Some(n) = notes {
        md.push_str(n.trim_end());
        md.push_str("\n\n");
    }
    md.push_str("## Conditions\n\n");
    for line in conditions.lines().filter(|l| !l.trim().is_empty()) {
        md.push_str(&format!("- {line}\n"));
    }
    md.push_str(
        "\nEach cell is the median of the repetitions. `*` best of the row (ties all \
         marked), `‡` most runs were paced by the client or the origin (CPU 1 at 90% or more \
         while the proxy was below 90% of its CPU or quota), so the proxy can do at least that \
         much; `–` not measured, with the reason.\n",
    );
    if g.proxies.iter().any(|p| p == FLOOR) {
        md.push_str(
            "\n`floor` is `rustle-bench floor`, a forwarder that copies bytes and does \
             nothing else (no parsing, pooling, timers or limits): the kernel's share of an \
             exchange alone. It is a reference, never starred.\n",
        );
    }
    md.push_str(&sweep::section(g));
    let mut header = vec!["scenario".to_string()];
    header.extend(g.proxies.iter().cloned());
    let rate: Vec<&String> = g.scenarios.iter().filter(|s| !is_hold(&g.unit(s))).collect();
    let hold: Vec<&String> = g.scenarios.iter().filter(|s| is_hold(&g.unit(s))).collect();
    let plain = |_: &str, v: f64| num(v);

    let mut section = |title: &str, intro: &str, rows: Vec<(String, Vec<Cell>)>| {
        if rows.is_empty() {
            return;
        }
        md.push_str(&format!("\n## {title}\n\n{intro}\n\n"));
        md.push_str(&table::markdown(&header, &rows));
    };
    section(
        "Throughput",
        "Requests (or WebSocket messages) per second, or Gbit/s for the streams.",
        g.throughput_rows(&rate),
    );
    section(
        "Latency",
        "The 50th / 99th / 99.9th percentile in ms; `*` marks the lowest 99th percentile. \
         The closed-loop scenarios offer a slower proxy less load, so compare the spread \
         between percentiles more than the medians.",
        g.latency_rows(&rate),
    );
    section(
        "Proxy CPU time",
        "utime + stime of all the proxy's processes over the measured window, per request \
         (µs) or per gigabyte moved (s).",
        g.cpu_rows(&rate),
    );
    if g.proxies.iter().any(|p| p == FLOOR) {
        let mut rows = Vec::new();
        for s in rate.iter().filter(|s| floor_comparable(s, &g.unit(s))) {
            let Some(floor) = g.median(s, FLOOR, |r| r.cpu_us_per_req) else { continue };
            let cells = g
                .proxies
                .iter()
                .map(|p| match g.median(s, p, |r| r.cpu_us_per_req) {
                    _ if p == FLOOR => Cell::Empty(String::new()),
                    Some(v) => {
                        Cell::Value { text: num(v - floor), best: false, client_paced: false }
                    }
                    None => g.empty(s, p),
                })
                .collect();
            rows.push((format!("{s}, µs/req"), cells));
        }
        section(
            "Above the floor",
            "Each proxy's median CPU per request minus the floor's median in the same \
             campaign, µs: its own work, with the kernel's share of the exchange taken out. \
             Kept-alive and relay scenarios only (with a new connection per request the \
             floor opens an origin connection each time, where an HTTP proxy pools); not \
             ranked, as the spread of the runs is about the size of these differences.",
            rows,
        );
    }
    section(
        "Proxy peak memory",
        "VmHWM summed over the proxy's processes at the end of the run, MB.",
        rate.iter()
            .map(|s| {
                let f = |r: &Row| r.rss_peak_kb.map(|k| k as f64 / 1024.0);
                (s.to_string(), g.row(s, Better::Lower, &f, &plain))
            })
            .collect(),
    );
    section(
        "Memory per open tunnel",
        "The proxy's RSS with the tunnels open and idle, minus its RSS before, per tunnel, \
         in KB (tunnels actually held in brackets). Tunnels are capped where the 20,000 file \
         limit per process runs out.",
        g.held_rows(&hold, |r| r.kb_per_tunnel, 1.0),
    );
    section(
        "Who set the pace",
        "Median busy share of the proxy's CPU (of its quota when it had one) / of the \
         client-and-origin CPU, in %.",
        rate.iter()
            .map(|s| {
                let text = |p: &str, v: f64| {
                    let c = g.median(s, p, |r| r.busy_client);
                    format!(
                        "{:.0} / {}",
                        v * 100.0,
                        c.map_or("?".into(), |c| format!("{:.0}", c * 100.0))
                    )
                };
                let cells = g
                    .row(s, Better::Higher, &|r| r.busy_proxy, &text)
                    .into_iter()
                    .map(|c| match c {
                        // A best busy share means nothing: drop the star.
                        Cell::Value { text, client_paced, .. } => {
                            Cell::Value { text, best: false, client_paced }
                        }
                        e => e,
                    })
                    .collect();
                (s.to_string(), cells)
            })
            .collect(),
    );
    md.push_str(&tls::section(g));
    md.push_str(&errors_section(g));
    md
}

fn errors_section(g: &Grid) -> String {
    let mut lines = Vec::new();
    for s in &g.scenarios {
        for p in &g.proxies {
            for r in g.runs(s, p) {
                if r.errors_total.unwrap_or(0) > 0 || r.status == Status::Failed {
                    let what = if r.status == Status::Failed { &r.reason } else { &r.errors };
                    lines.push(format!("- {s} / {p} / rep {}: {what}", r.rep));
                }
            }
        }
    }
    let body = if lines.is_empty() { "None in any run.".to_string() } else { lines.join("\n") };
    format!("\n## Errors\n\nFailed exchanges by kind, per run.\n\n{body}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(scenario: &str, proxy: &str, conns: Option<u32>, tput: f64, cpu: f64) -> Row {
        let mut r = Row::new("c", scenario, proxy, 1, 1);
        r.unit = "req/s".into();
        r.connections = conns;
        r.throughput = Some(tput);
        r.completed = Some(1000);
        r.errors_total = Some(0);
        r.cpu_us_per_req = Some(cpu);
        r
    }

    #[test]
    fn the_floor_is_shown_but_never_starred() {
        let mut rows = Vec::new();
        for s in ["http-ka-1k", "http-close-1k"] {
            let floor_cpu = if s == "http-ka-1k" { 12.0 } else { 60.0 };
            rows.push(run(s, "rustle", None, 300.0, 15.0));
            rows.push(run(s, "nginx", None, 250.0, 18.0));
            rows.push(run(s, "floor", None, 400.0, floor_cpu));
        }
        let g = Grid::new(&rows);
        let md = render(&g, "x", None);
        // Faster and cheaper than both proxies, and still the star goes to rustle.
        assert!(md.contains("| http-ka-1k, req/s | 300 * | 250 | 400 |"), "{md}");
        assert!(md.contains("| http-ka-1k, µs/req | 15.0 * | 18.0 | 12.0 |"), "{md}");
        // Above the floor: differences, unranked, and no row where the floor
        // opens an origin connection per request while the proxies pool.
        let above = &md[md.find("## Above the floor").expect("the table")..];
        let above = &above[..above[3..].find("\n## ").map_or(above.len(), |i| i + 3)];
        assert!(above.contains("| http-ka-1k, µs/req | 3.00 | 6.00 | – |"), "{above}");
        assert!(!above.contains("http-close"), "{above}");
        assert!(!above.contains('*'), "{above}");
    }

    #[test]
    fn a_swept_floor_is_never_starred() {
        let mut rows = Vec::new();
        for conns in [16, 64] {
            rows.push(run("relay-ka-1k", "rustle", Some(conns), 300.0, 15.0));
            rows.push(run("relay-ka-1k", "nginx", Some(conns), 280.0, 16.0));
            rows.push(run("relay-ka-1k", "floor", Some(conns), 500.0, 11.0));
        }
        let g = Grid::new(&rows);
        let md = sweep::section(&g);
        assert!(md.contains("| rustle | 16 | 300 * |"), "{md}");
        assert!(md.contains("| nginx | 16 | 280 |"), "{md}");
        assert!(md.contains("| floor | 16 | 500 |"), "{md}");
    }
}
