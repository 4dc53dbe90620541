//! The concurrency sweep (`campaign --sweep`): for every scenario run at
//! several connection counts, each proxy's best clean level (the count with
//! the highest median throughput among those whose runs had no errors), a
//! table with its median at every level, and a chart of throughput against
//! connections.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::stats::{best_of_row, client_paced, Better, TIE};
use super::table::{self, num, Cell};
use super::FLOOR;
use super::{svg, Grid, Swept};
use crate::campaign::record::{Row, Status};

/// What a proxy did at one connection count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Level {
    pub connections: u32,
    /// Median throughput of the measured runs; `None` when none measured.
    pub median: Option<f64>,
    /// Measured, and no run at this level failed or had a failed exchange.
    pub clean: bool,
}

/// The best clean level as (connections, median): the highest median among
/// the clean levels, a tie going to the lower connection count; `None` when
/// no level is clean.
pub(super) fn best_clean(levels: &[Level]) -> Option<(u32, f64)> {
    let mut clean: Vec<(u32, f64)> = levels
        .iter()
        .filter(|l| l.clean)
        .filter_map(|l| Some((l.connections, l.median?)))
        .filter(|(_, m)| !m.is_nan())
        .collect();
    clean.sort_by_key(|(c, _)| *c);
    let mut best: Option<(u32, f64)> = None;
    for (c, m) in clean {
        // Only a strictly higher median moves the best to a higher count.
        if best.is_none_or(|(_, b)| m > b + b.abs() * TIE) {
            best = Some((c, m));
        }
    }
    best
}

/// A run that disqualifies its level: the load generator failed, an
/// exchange failed, or nothing completed. A skipped run (the proxy lacks
/// the protocol or is not installed) measured nothing and counts neither way.
fn dirty(r: &Row) -> bool {
    match r.status {
        Status::Skipped => false,
        Status::Failed => true,
        Status::Ok => r.errors_total.unwrap_or(0) > 0 || r.completed == Some(0),
    }
}

fn levels(g: &Grid, sw: &Swept, proxy: &str) -> Vec<Level> {
    sw.levels
        .iter()
        .map(|(connections, label)| {
            let median = g.median(label, proxy, |r| r.throughput);
            let clean = median.is_some() && !g.runs(label, proxy).iter().any(|r| dirty(r));
            Level { connections: *connections, median, clean }
        })
        .collect()
}

/// The markdown section: empty when no scenario was swept.
pub(super) fn section(g: &Grid) -> String {
    if g.swept.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n## Best clean concurrency level\n\nEvery swept scenario ran at each connection \
         count of `--sweep`. A proxy's best clean level is the count with the highest median \
         throughput among those whose runs all completed without an error (a tie goes to the \
         lower count); that figure is the one to compare. `✗` marks a level with errors or a \
         failed run, `*` the best proxy at its best level, `‡` as above.\n",
    );
    for sw in &g.swept {
        md.push_str(&table(g, sw));
    }
    md
}

fn table(g: &Grid, sw: &Swept) -> String {
    let unit = sw.levels.first().map_or(String::new(), |(_, label)| g.unit(label));
    let mut header = vec!["proxy".to_string(), "best clean level".into(), format!("{unit} there")];
    header.extend(sw.levels.iter().map(|(n, _)| format!("{n} conns")));
    let all: Vec<Vec<Level>> = g.proxies.iter().map(|p| levels(g, sw, p)).collect();
    let bests: Vec<Option<(u32, f64)>> = all.iter().map(|l| best_clean(l)).collect();
    // The floor is a reference, not a contender: it never takes the star.
    let contenders: Vec<Option<f64>> = g
        .proxies
        .iter()
        .zip(&bests)
        .map(|(p, b)| if p == FLOOR { None } else { b.map(|b| b.1) })
        .collect();
    let stars = best_of_row(&contenders, Better::Higher);
    let value =
        |text: String, best: bool, client_paced: bool| Cell::Value { text, best, client_paced };
    let rows = g
        .proxies
        .iter()
        .zip(all.iter().zip(bests.iter().zip(stars)))
        .map(|(p, (levels, (best, star)))| {
            let paced = |label: &str| {
                let paces: Vec<_> = g.ok(label, p).iter().filter_map(|r| r.pace).collect();
                client_paced(&paces)
            };
            let label_of =
                |n: u32| sw.levels.iter().find(|l| l.0 == n).map_or("", |l| l.1.as_str());
            let first = sw.levels.first().map_or("", |l| l.1.as_str());
            let mut cells = match best {
                Some((n, m)) => vec![
                    value(n.to_string(), false, false),
                    value(num(*m), star, paced(label_of(*n))),
                ],
                None if levels.iter().any(|l| l.median.is_some()) => {
                    vec![value("none clean".into(), false, false), Cell::Empty(String::new())]
                }
                None => vec![g.empty(first, p), Cell::Empty(String::new())],
            };
            cells.extend(levels.iter().zip(&sw.levels).map(|(l, (_, label))| match l.median {
                Some(m) => {
                    let text = if l.clean { num(m) } else { format!("{} ✗", num(m)) };
                    value(text, false, paced(label))
                }
                None => g.empty(label, p),
            }));
            (p.clone(), cells)
        })
        .collect::<Vec<_>>();
    format!("\n### {} ({unit})\n\n{}", sw.scenario, table::markdown(&header, &rows))
}

/// A chart per swept scenario: median throughput against connections, a
/// line per proxy (every measured level, clean or not; the table says which).
pub(super) fn charts(g: &Grid, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for sw in &g.swept {
        let series: Vec<(String, Vec<(f64, f64)>)> = g
            .proxies
            .iter()
            .filter_map(|p| {
                let pts: Vec<(f64, f64)> = sw
                    .levels
                    .iter()
                    .enumerate()
                    .filter_map(|(i, (_, label))| {
                        g.median(label, p, |r| r.throughput).map(|v| (i as f64, v))
                    })
                    .collect();
                (!pts.is_empty()).then(|| (p.clone(), pts))
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let unit = sw.levels.first().map_or(String::new(), |(_, label)| g.unit(label));
        // Levels evenly spaced (a sweep usually multiplies), labelled by count.
        let names: Vec<String> = sw.levels.iter().map(|(n, _)| n.to_string()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let file = dir.join(format!("sweep-{}.svg", sw.scenario));
        let title = format!("Throughput against connections, {} ({unit})", sw.scenario);
        svg::lines(&file, &title, ("connections", &unit), Some(&names), &series)?;
        out.push((title, file));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lv(connections: u32, median: f64, clean: bool) -> Level {
        Level { connections, median: Some(median), clean }
    }

    #[test]
    fn best_clean_level_selection() {
        // The highest median wins among clean levels only.
        let l =
            [lv(16, 10.0, true), lv(64, 30.0, true), lv(256, 50.0, false), lv(1024, 20.0, true)];
        assert_eq!(best_clean(&l), Some((64, 30.0)));
        // A tie goes to the lower connection count, whatever the order given.
        let l = [lv(1024, 40.0, true), lv(256, 40.0, true), lv(16, 5.0, true)];
        assert_eq!(best_clean(&l), Some((256, 40.0)));
        // No clean level, or nothing measured: none.
        assert_eq!(best_clean(&[lv(16, 10.0, false), lv(64, 20.0, false)]), None);
        let unmeasured = Level { connections: 16, median: None, clean: true };
        assert_eq!(best_clean(&[unmeasured]), None);
        assert_eq!(best_clean(&[]), None);
    }

    fn run(proxy: &str, conns: u32, rep: u32, tput: f64, errors: u64) -> Row {
        let mut r = Row::new("c", "http-ka-1k", proxy, rep, 1);
        r.connections = Some(conns);
        r.unit = "req/s".into();
        r.throughput = Some(tput);
        r.completed = Some(1000);
        r.errors_total = Some(errors);
        r
    }

    #[test]
    fn sweep_table_and_grid_labels() {
        let mut rows = Vec::new();
        for rep in 1..=2 {
            rows.push(run("rustle", 16, rep, 100.0, 0));
            rows.push(run("rustle", 64, rep, 300.0, 0));
            // One run with errors disqualifies the level, however fast.
            rows.push(run("rustle", 256, rep, 900.0, if rep == 2 { 3 } else { 0 }));
            rows.push(run("slow", 16, rep, 50.0, 1));
            rows.push(run("slow", 64, rep, 80.0, 2));
            rows.push(run("slow", 256, rep, 90.0, 0).skipped("start failed: x"));
        }
        let mut gone = Row::new("c", "http-ka-1k", "nginx", 1, 1).skipped("not installed");
        gone.connections = Some(16);
        rows.push(gone);
        let g = Grid::new(&rows);
        assert_eq!(g.scenarios, ["http-ka-1k@16", "http-ka-1k@64", "http-ka-1k@256"]);
        assert_eq!(g.swept.len(), 1);
        let md = section(&g);
        assert!(md.contains("### http-ka-1k (req/s)"), "{md}");
        assert!(md.contains("| rustle | 64 | 300 | 100 | 300 | 900 ✗ |"), "{md}");
        assert!(
            md.contains("| slow | none clean | – | 50.0 ✗ | 80.0 ✗ | – (start failed) |"),
            "{md}"
        );
        assert!(md.contains("| nginx | – (not installed) | – |"), "{md}");
        let dir = std::env::temp_dir().join(format!("rb-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let charts = charts(&g, &dir).unwrap();
        assert_eq!(charts.len(), 1);
        let svg = std::fs::read_to_string(&charts[0].1).unwrap();
        assert!(svg.contains("connections") && svg.contains("256"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_level_is_not_a_sweep() {
        let rows = [run("rustle", 64, 1, 100.0, 0), run("nginx", 64, 1, 90.0, 0)];
        let g = Grid::new(&rows);
        assert_eq!(g.scenarios, ["http-ka-1k"]);
        assert!(section(&g).is_empty());
    }
}
