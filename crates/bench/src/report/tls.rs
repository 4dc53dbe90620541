//! The TLS relay scenarios (`tls-term-*`, `tls-orig-*`): CPU per handshake
//! in the close scenarios, throughput and CPU per GB on 1 MB answers, how
//! often the proxy's connections to the HTTPS origin resumed a session,
//! rustle's ratios to nginx and the targets of issue 7.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::stats::Better;
use super::table::{self, num, Cell};
use super::{svg, Grid};
use crate::campaign::record::Row;

fn is_tls(s: &str) -> bool {
    s.starts_with("tls-term-") || s.starts_with("tls-orig-")
}

/// Proxy CPU per TLS handshake (µs): a close scenario makes one per
/// request, with the client (tls-term: the client offers no resumption) or
/// with the origin (tls-orig: counted by the origin, resumed or not).
pub(crate) fn cpu_per_handshake(r: &Row) -> Option<f64> {
    let handshakes = if r.scenario.starts_with("tls-orig-") {
        r.origin_tls_handshakes.or(r.completed)?
    } else {
        r.completed?
    };
    let cpu = r.proxy_cpu_s?;
    (handshakes > 0).then(|| cpu * 1e6 / handshakes as f64)
}

/// Body bytes moved per second, in Gbit/s.
fn gbit(r: &Row) -> Option<f64> {
    let d = r.duration_s.filter(|d| *d > 0.0)?;
    Some(r.bytes? as f64 * 8.0 / d / 1e9)
}

/// Share of the origin-side handshakes that resumed, in %. The origin
/// counts a connection when it accepts it and a resumption when its
/// handshake ends, so a window can catch a few more of the second: capped.
fn resumed_pct(r: &Row) -> Option<f64> {
    let h = r.origin_tls_handshakes.filter(|h| *h > 0)?;
    Some((r.origin_tls_resumed? as f64 * 100.0 / h as f64).min(100.0))
}

/// The markdown section; empty when the campaign has no TLS scenario.
pub(super) fn section(g: &Grid) -> String {
    let tls: Vec<&String> = g.scenarios.iter().filter(|s| is_tls(s)).collect();
    if tls.is_empty() {
        return String::new();
    }
    let mut header = vec!["scenario".to_string()];
    header.extend(g.proxies.iter().cloned());
    let plain = |_: &str, v: f64| num(v);
    let mut md = String::from(
        "\n## TLS relays\n\n`tls-term-*`: TLS 1.3 from the client to the proxy, plain TCP to \
         the origin; `tls-orig-*`: plain TCP from the client, TLS 1.3 from the proxy to the \
         HTTPS origin, which it verifies. `-1k`: 64 kept-alive connections, 1 KB answers; \
         `-1m`: 16, 1 MB answers; `-close`: 64 connections, a new one (and a handshake) per \
         1 KB request.\n",
    );
    let mut table = |title: &str, intro: &str, rows: Vec<(String, Vec<Cell>)>| {
        if rows.iter().all(|(_, c)| c.iter().all(|c| matches!(c, Cell::Empty(_)))) {
            return;
        }
        md.push_str(&format!("\n### {title}\n\n{intro}\n\n"));
        md.push_str(&table::markdown(&header, &rows));
    };
    let close: Vec<&&String> = tls.iter().filter(|s| s.ends_with("-close")).collect();
    table(
        "CPU per handshake",
        "Proxy CPU (µs) per TLS handshake in the close scenarios: per request for tls-term \
         (full handshakes, the client offers no resumption), per connection the origin \
         accepted for tls-orig (resumed or not, see below). It includes the rest of the \
         request's work: accepting, relaying 1 KB and the plain connection.",
        close
            .iter()
            .map(|s| (s.to_string(), g.row(s, Better::Lower, &cpu_per_handshake, &plain)))
            .collect(),
    );
    let big: Vec<&&String> = tls.iter().filter(|s| s.ends_with("-1m")).collect();
    table(
        "1 MB answers",
        "Answer bytes per second (Gbit/s), and proxy CPU per GB of answers (s).",
        big.iter()
            .flat_map(|s| {
                [
                    (format!("{s}, Gbit/s"), g.row(s, Better::Higher, &gbit, &plain)),
                    (format!("{s}, s/GB"), g.row(s, Better::Lower, &|r| r.cpu_s_per_gb, &plain)),
                ]
            })
            .collect(),
    );
    // Kept-alive scenarios open their origin connections in the warmup.
    let orig: Vec<&&String> =
        close.iter().filter(|s| s.starts_with("tls-orig-")).copied().collect();
    table(
        "Resumption towards the origin",
        "Share of the TLS connections the HTTPS origin accepted in the measured window that \
         resumed a session (%, capped at 100: the two counters are read a few ms apart), and \
         how many connections that was (median). The origin issues stateless TLS 1.3 \
         tickets, two per handshake.",
        orig.iter()
            .map(|s| {
                let text = |p: &str, v: f64| {
                    let n = g.median(s, p, |r| r.origin_tls_handshakes.map(|h| h as f64));
                    format!("{:.0}% ({})", v, n.map_or("?".into(), num))
                };
                let cells = g
                    .row(s, Better::Higher, &resumed_pct, &text)
                    .into_iter()
                    .map(|c| match c {
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
    md.push_str(&ratios(g, &tls));
    md
}

/// rustle against nginx per TLS scenario, and the targets of issue 7:
/// at least nginx's requests/s at 1 KB and its throughput on 1 MB, at most
/// its CPU per handshake.
fn ratios(g: &Grid, tls: &[&String]) -> String {
    let has = |p: &str| g.proxies.iter().any(|x| x == p);
    if !has("rustle") || !has("nginx") {
        return String::new();
    }
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for s in tls {
        let m = |p: &str, f: &dyn Fn(&Row) -> Option<f64>| g.median(s, p, f);
        let rps = (m("rustle", &|r| r.throughput), m("nginx", &|r| r.throughput));
        let cpu = (m("rustle", &|r| r.cpu_us_per_req), m("nginx", &|r| r.cpu_us_per_req));
        let ratio = |(a, b): (Option<f64>, Option<f64>)| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "–".to_string(),
        };
        let v = |x: Option<f64>| x.map_or("–".to_string(), num);
        rows.push(format!(
            "| {s} | {} | {} | {} | {} | {} | {} |",
            v(rps.0),
            v(rps.1),
            ratio(rps),
            v(cpu.0),
            v(cpu.1),
            ratio(cpu)
        ));
        let (what, pair, higher) = if s.ends_with("-close") {
            let hs = (m("rustle", &cpu_per_handshake), m("nginx", &cpu_per_handshake));
            ("CPU per handshake ≤ nginx's", hs, false)
        } else if s.ends_with("-1m") {
            ("throughput ≥ nginx's", (m("rustle", &gbit), m("nginx", &gbit)), true)
        } else {
            ("requests/s ≥ nginx's", rps, true)
        };
        let verdict = match pair {
            (Some(a), Some(b)) if (a >= b) == higher || a == b => "met",
            (Some(_), Some(_)) => "not met",
            _ => "not measured",
        };
        targets.push(format!("| {s} | {what} | {} | {} | {verdict} |", v(pair.0), v(pair.1)));
    }
    format!(
        "\n### rustle against nginx\n\nMedians; ratio = rustle / nginx (requests/s: higher \
         is better; CPU µs per request: lower is better).\n\n\
         | scenario | rustle req/s | nginx req/s | ratio | rustle CPU µs/req | nginx CPU µs/req \
         | ratio |\n| :-- | --: | --: | --: | --: | --: | --: |\n{}\n\
         \n### Issue 7 targets\n\nAt 1 KB requests/s, on 1 MB answers Gbit/s, in the close \
         scenarios CPU µs per handshake; medians of this run.\n\n\
         | scenario | target | rustle | nginx | verdict |\n| :-- | :-- | --: | --: | :-- |\n{}\n",
        rows.join("\n"),
        targets.join("\n")
    )
}

/// The TLS charts: throughput is drawn with the other groups; this adds
/// CPU per handshake in the close scenarios.
pub(super) fn charts(g: &Grid, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let close: Vec<String> =
        g.scenarios.iter().filter(|s| is_tls(s) && s.ends_with("-close")).cloned().collect();
    let series: Vec<(String, Vec<Option<f64>>)> = g
        .proxies
        .iter()
        .map(|p| (p.clone(), close.iter().map(|s| g.median(s, p, cpu_per_handshake)).collect()))
        .filter(|(_, v): &(String, Vec<Option<f64>>)| v.iter().any(Option::is_some))
        .collect();
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let file = dir.join("tls-cpu-per-handshake.svg");
    let title = "Proxy CPU per TLS handshake (µs)".to_string();
    svg::bars(&file, &title, "µs per handshake", &close, &series)?;
    Ok(vec![(title, file)])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn per_handshake_and_resumption() {
        let mut r = Row::new("c", "tls-orig-close", "rustle", 1, 1);
        r.proxy_cpu_s = Some(2.0);
        r.completed = Some(4000);
        r.origin_tls_handshakes = Some(1000);
        r.origin_tls_resumed = Some(250);
        assert_eq!(cpu_per_handshake(&r), Some(2000.0));
        assert_eq!(resumed_pct(&r), Some(25.0));
        r.origin_tls_resumed = Some(1010);
        assert_eq!(resumed_pct(&r), Some(100.0));
        r.scenario = "tls-term-close".into();
        assert_eq!(cpu_per_handshake(&r), Some(500.0));
        r.completed = Some(0);
        assert_eq!(cpu_per_handshake(&r), None);
        r.bytes = Some(1_000_000_000);
        r.duration_s = Some(8.0);
        assert_eq!(gbit(&r), Some(1.0));
        assert!(is_tls("tls-term-1k") && !is_tls("relay-ka-1k"));
    }
}
