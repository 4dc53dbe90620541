//! One CSV row per run: what the campaign writes and the report reads.
//!
//! The columns are the fields of [`Row`] in order; bench/README.md lists
//! them with their units. Numbers a run could not measure are empty cells
//! (`None`), never zero, so that a median is not dragged down by them.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// What became of one scenario × proxy × repetition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The load ran; its numbers are in the row (errors may be non-zero).
    Ok,
    /// Not run: the proxy lacks the protocol, is not installed, or would not start.
    Skipped,
    /// The load generator itself failed (no numbers).
    Failed,
}

/// Which role's CPU ran out first (see `report::stats::pace_setter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pace {
    /// The proxy's CPU (or its quota) was at least 90% used.
    Proxy,
    /// The client-and-origin CPU was, and the proxy's was not.
    Client,
    /// Neither: latency, the link or the scenario's own rate set it.
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Campaign id (start time, UTC, `YYYYmmdd-HHMMSS`).
    pub campaign: String,
    pub scenario: String,
    pub proxy: String,
    /// Repetition, from 1.
    pub rep: u32,
    /// Position of the proxy in this repetition's rotated order, from 1.
    pub order: u32,
    pub status: Status,
    /// Short reason for a skipped or failed cell (shown in the report).
    pub reason: String,
    /// The unit of `throughput`: `req/s`, `Gbit/s`, `msg/s` or `KB/tunnel`.
    pub unit: String,
    /// The headline number in `unit` (median-able across repetitions).
    pub throughput: Option<f64>,
    pub completed: Option<u64>,
    pub bytes: Option<u64>,
    pub duration_s: Option<f64>,
    pub lat_p50_us: Option<u64>,
    pub lat_p90_us: Option<u64>,
    pub lat_p99_us: Option<u64>,
    pub lat_p99_9_us: Option<u64>,
    pub errors_total: Option<u64>,
    /// Non-zero error counts as `kind=n` joined by `;`.
    pub errors: String,
    /// utime+stime of every process of the proxy over the measured window, s.
    pub proxy_cpu_s: Option<f64>,
    pub cpu_us_per_req: Option<f64>,
    pub cpu_s_per_gb: Option<f64>,
    /// Sum of VmHWM over the proxy's processes at the end of the run, KB.
    pub rss_peak_kb: Option<u64>,
    pub tunnels_requested: Option<u64>,
    pub tunnels_held: Option<u64>,
    /// The most tunnels this proxy could hold under the file limit.
    pub tunnel_cap: Option<u64>,
    pub rss_before_kb: Option<u64>,
    pub rss_held_kb: Option<u64>,
    pub kb_per_tunnel: Option<f64>,
    /// Share of its CPU the proxy used (of the quota when there is one), 0..1.
    pub busy_proxy: Option<f64>,
    /// Busy share of the client-and-origin CPU from /proc/stat, 0..1.
    pub busy_client: Option<f64>,
    pub pace: Option<Pace>,
    /// Proxy CPU quota in cores, empty when unlimited.
    pub quota: Option<f64>,
    /// `netns` or `loopback`.
    pub net: String,
    /// The netem / rate settings on the client link, empty for none.
    pub link: String,
    /// Connections of the load: the scenario's default or a `--sweep`
    /// level; empty for the tunnel holds. Last, and optional when read:
    /// CSVs written before it existed get the scenario's default.
    #[serde(default)]
    pub connections: Option<u32>,
    /// TLS-originating scenarios: TLS connections the HTTPS origin accepted
    /// over the measured window, and how many of them resumed a session.
    /// Optional when read, like `connections`.
    #[serde(default)]
    pub origin_tls_handshakes: Option<u64>,
    #[serde(default)]
    pub origin_tls_resumed: Option<u64>,
    /// The profile's family the run belongs to (`http`, `tls`, ...); empty
    /// for an ad hoc campaign. Optional when read, like `connections`.
    #[serde(default)]
    pub stage: String,
    /// Busy time of every CPU of the machine over the measured window, s:
    /// the proxy, client and origin, and the kernel's work wherever it ran.
    #[serde(default)]
    pub machine_cpu_s: Option<f64>,
}

impl Row {
    /// A row with the identifying fields set (connections: the scenario's
    /// default) and no measurements.
    pub fn new(campaign: &str, scenario: &str, proxy: &str, rep: u32, order: u32) -> Row {
        Row {
            campaign: campaign.to_string(),
            scenario: scenario.to_string(),
            proxy: proxy.to_string(),
            rep,
            order,
            status: Status::Ok,
            reason: String::new(),
            unit: String::new(),
            throughput: None,
            completed: None,
            bytes: None,
            duration_s: None,
            lat_p50_us: None,
            lat_p90_us: None,
            lat_p99_us: None,
            lat_p99_9_us: None,
            errors_total: None,
            errors: String::new(),
            proxy_cpu_s: None,
            cpu_us_per_req: None,
            cpu_s_per_gb: None,
            rss_peak_kb: None,
            tunnels_requested: None,
            tunnels_held: None,
            tunnel_cap: None,
            rss_before_kb: None,
            rss_held_kb: None,
            kb_per_tunnel: None,
            busy_proxy: None,
            busy_client: None,
            pace: None,
            quota: None,
            net: String::new(),
            link: String::new(),
            connections: super::scenario::default_connections(scenario),
            origin_tls_handshakes: None,
            origin_tls_resumed: None,
            stage: String::new(),
            machine_cpu_s: None,
        }
    }

    pub fn skipped(mut self, reason: impl Into<String>) -> Row {
        self.status = Status::Skipped;
        self.reason = reason.into();
        self
    }
}

/// Appends rows to a CSV file, writing the header once, flushing each row
/// so that an interrupted campaign keeps what it measured.
pub struct Writer {
    inner: csv::Writer<std::fs::File>,
}

impl Writer {
    pub fn create(path: &Path) -> Result<Writer> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Writer { inner: csv::Writer::from_writer(file) })
    }

    pub fn write(&mut self, row: &Row) -> Result<()> {
        self.inner.serialize(row).context("writing a CSV row")?;
        self.inner.flush().context("flushing the CSV")
    }
}

/// Reads a `runs.csv`; rows without a connection count (older CSVs) get
/// their scenario's default.
pub fn read(path: &Path) -> Result<Vec<Row>> {
    let mut r =
        csv::Reader::from_path(path).with_context(|| format!("opening {}", path.display()))?;
    r.deserialize()
        .map(|row: csv::Result<Row>| {
            let mut row = row.with_context(|| format!("reading {}", path.display()))?;
            if row.connections.is_none() {
                row.connections = super::scenario::default_connections(&row.scenario);
            }
            Ok(row)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn csv_round_trip_keeps_every_field() {
        let dir = std::env::temp_dir().join(format!("rb-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.csv");
        let mut a = Row::new("c1", "http-ka-1k", "rustle", 1, 2);
        a.unit = "req/s".into();
        a.throughput = Some(12345.5);
        a.lat_p99_us = Some(900);
        a.errors = "read=2;timeout=1".into();
        a.pace = Some(Pace::Proxy);
        a.quota = Some(0.5);
        a.net = "loopback".into();
        let b = Row::new("c1", "socks-ka-1k", "nginx", 1, 1).skipped("no SOCKS, it has none");
        {
            let mut w = Writer::create(&path).unwrap();
            w.write(&a).unwrap();
            w.write(&b).unwrap();
        }
        let back = read(&path).unwrap();
        assert_eq!(back, vec![a, b]);
        let header = std::fs::read_to_string(&path).unwrap();
        assert!(header.starts_with("campaign,scenario,proxy,rep,order,status,reason,unit,"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn write_rows(path: &Path, rows: &[Row]) {
        let mut w = Writer::create(path).unwrap();
        for r in rows {
            w.write(r).unwrap();
        }
    }

    #[test]
    fn csv_with_the_connections_column_keeps_sweep_levels() {
        let dir = std::env::temp_dir().join(format!("rb-record-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.csv");
        let mut a = Row::new("c1", "http-ka-1k", "rustle", 1, 1);
        assert_eq!(a.connections, Some(64));
        a.connections = Some(1024);
        let mut b = Row::new("c1", "http-close-1k", "nginx", 1, 2);
        b.connections = Some(16);
        let hold = Row::new("c1", "mem-tunnels-connect-1000", "rustle", 1, 1);
        assert_eq!(hold.connections, None);
        write_rows(&path, &[a.clone(), b.clone(), hold.clone()]);
        let text = std::fs::read_to_string(&path).unwrap();
        let header = text.lines().next().unwrap();
        assert!(header.ends_with(
            ",link,connections,origin_tls_handshakes,origin_tls_resumed,stage,machine_cpu_s"
        ));
        assert_eq!(read(&path).unwrap(), vec![a, b, hold]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn csv_without_the_connections_column_gets_scenario_defaults() {
        let dir = std::env::temp_dir().join(format!("rb-record-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.csv");
        let mut rows = vec![
            Row::new("c1", "http-ka-1m", "rustle", 1, 1),
            Row::new("c1", "mix-http", "nginx", 1, 2),
            Row::new("c1", "mem-tunnels-socks-5000", "dante", 1, 3),
            Row::new("c1", "custom-thing", "x", 1, 4),
        ];
        rows[0].throughput = Some(2.5);
        write_rows(&path, &rows);
        // Drop the last five columns, as a CSV written before they existed.
        let old: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| {
                let mut l = l;
                for _ in 0..5 {
                    l = l.rsplit_once(',').unwrap().0;
                }
                format!("{l}\n")
            })
            .collect();
        assert!(old.lines().next().unwrap().ends_with(",net,link"));
        std::fs::write(&path, old).unwrap();
        let back = read(&path).unwrap();
        let conns: Vec<Option<u32>> = back.iter().map(|r| r.connections).collect();
        assert_eq!(conns, [Some(16), Some(2000), None, None]);
        assert_eq!(back, rows);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
