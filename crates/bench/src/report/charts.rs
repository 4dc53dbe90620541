//! Which charts the report draws, from the grid of medians.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{is_hold, svg, Grid};

/// Draws every chart the data allows; returns (title, file) pairs.
pub(super) fn draw(g: &Grid, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    // Throughput: one chart per group of scenarios sharing a prefix and a unit.
    let mut groups: Vec<(String, String, Vec<String>)> = Vec::new();
    for s in &g.scenarios {
        let unit = g.unit(s);
        if is_hold(&unit) {
            continue;
        }
        let prefix = if s.contains("stream") {
            "streams".to_string()
        } else if s.starts_with("tls-") {
            // 1 MB answers are counted in hundreds a second, 1 KB in thousands.
            if s.ends_with("-1m") { "tls-1m" } else { "tls" }.to_string()
        } else {
            s.split('-').next().unwrap_or(s).to_string()
        };
        match groups.iter_mut().find(|(p, u, _)| *p == prefix && *u == unit) {
            Some(gr) => gr.2.push(s.clone()),
            None => groups.push((prefix, unit, vec![s.clone()])),
        }
    }
    for (prefix, unit, scenarios) in &groups {
        let series = g
            .proxies
            .iter()
            .map(|p| {
                (p.clone(), scenarios.iter().map(|s| g.median(s, p, |r| r.throughput)).collect())
            })
            .filter(|(_, v): &(String, Vec<Option<f64>>)| v.iter().any(Option::is_some))
            .collect::<Vec<_>>();
        if series.is_empty() {
            continue;
        }
        let file = dir.join(format!("throughput-{prefix}-{}.svg", unit.replace('/', "-per-")));
        let title = format!("Throughput, {prefix} ({unit})");
        svg::bars(&file, &title, unit, scenarios, &series)?;
        out.push((title, file));
    }

    // CPU per request over every request-counting scenario.
    let req: Vec<String> = g.scenarios.iter().filter(|s| g.unit(s) == "req/s").cloned().collect();
    let series = g
        .proxies
        .iter()
        .map(|p| (p.clone(), req.iter().map(|s| g.median(s, p, |r| r.cpu_us_per_req)).collect()))
        .filter(|(_, v): &(String, Vec<Option<f64>>)| v.iter().any(Option::is_some))
        .collect::<Vec<_>>();
    if !series.is_empty() {
        let file = dir.join("cpu-per-request.svg");
        let title = "Proxy CPU per request (µs)".to_string();
        svg::bars(&file, &title, "µs per request", &req, &series)?;
        out.push((title, file));
    }

    // Memory against open tunnels: a line per proxy and tunnel kind.
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for s in g.scenarios.iter().filter(|s| is_hold(&g.unit(s))) {
        let kind = if s.contains("socks") { "SOCKS" } else { "CONNECT" };
        for p in &g.proxies {
            let held = g.median(s, p, |r| r.tunnels_held.map(|h| h as f64));
            let mb = g.median(s, p, |r| {
                Some(r.rss_held_kb?.saturating_sub(r.rss_before_kb?) as f64 / 1024.0)
            });
            if let (Some(x), Some(y)) = (held, mb) {
                let name = format!("{p} {kind}");
                match lines.iter_mut().find(|(n, _)| *n == name) {
                    Some(l) => l.1.push((x, y)),
                    None => lines.push((name, vec![(x, y)])),
                }
            }
        }
    }
    if !lines.is_empty() {
        for l in &mut lines {
            l.1.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let file = dir.join("memory-per-tunnel.svg");
        let title = "Proxy memory against open tunnels".to_string();
        svg::lines(&file, &title, ("tunnels held", "MB above idle"), None, &lines)?;
        out.push((title, file));
    }

    // Latency percentiles for the kept-alive 1 KB scenarios.
    for s in g.scenarios.iter().filter(|s| s.ends_with("-ka-1k")) {
        let series: Vec<(String, Vec<(f64, f64)>)> = g
            .proxies
            .iter()
            .filter_map(|p| {
                let pts: Vec<(f64, f64)> = [
                    g.median(s, p, |r| r.lat_p50_us.map(|v| v as f64)),
                    g.median(s, p, |r| r.lat_p90_us.map(|v| v as f64)),
                    g.median(s, p, |r| r.lat_p99_us.map(|v| v as f64)),
                    g.median(s, p, |r| r.lat_p99_9_us.map(|v| v as f64)),
                ]
                .iter()
                .enumerate()
                .filter_map(|(i, v)| v.map(|v| (i as f64, v / 1000.0)))
                .collect();
                (!pts.is_empty()).then(|| (p.clone(), pts))
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let file = dir.join(format!("latency-{s}.svg"));
        let title = format!("Latency percentiles, {s} (ms)");
        let names = ["p50", "p90", "p99", "p99.9"];
        svg::lines(&file, &title, ("percentile", "ms"), Some(&names), &series)?;
        out.push((title, file));
    }
    Ok(out)
}
