//! The Prometheus text exposition format (0.0.4) of the workers' summed counters:
//! `# HELP` and `# TYPE` before each family, label values escaped, histogram buckets made
//! cumulative.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::{
    Histogram, ListenerCounters, ListenerStats, PeerSums, Summed, UserStats, WorkerStats,
    AUTH_HASHES, AUTH_HASHES_REFUSED, CAUSES, CLASSES, DURATION_BUCKETS, LAST_RELOAD_MS,
    LAST_RELOAD_OK, LATENCY_BUCKETS, PROTOCOLS, RELOADS, RELOAD_FAILURES,
};

/// A listener as its labels name it.
#[derive(Debug, Clone)]
pub(crate) struct ListenerLabel {
    /// Its configured `name`, or its address when it has none (as the access log names
    /// it).
    pub(crate) name: String,
    pub(crate) kind: &'static str,
    pub(crate) counters: Arc<ListenerCounters>,
}

/// What a scrape reads besides the workers' counters.
pub(crate) struct Scrape<'a> {
    pub(crate) listeners: &'a [ListenerLabel],
    pub(crate) workers: &'a [Arc<WorkerStats>],
    pub(crate) max_user_series: usize,
    pub(crate) parents: &'a [ParentView],
    pub(crate) routes: &'a [RouteView],
    pub(crate) process: &'a Process,
    /// Each (quota, user): used, limit, used up (`state::Keeper::metrics`).
    pub(crate) quotas: &'a [(String, String, u64, u64, bool)],
}

/// A parent's state at a scrape.
pub(crate) struct ParentView {
    pub(crate) name: String,
    pub(crate) up: bool,
    pub(crate) failures: u64,
    pub(crate) connect: Summed,
    pub(crate) traffic: PeerSums,
    /// How long its last health probe took (None: it has no probe, or none ran yet).
    pub(crate) probe: Option<Duration>,
}

/// A route's counts at a scrape (routes through parents).
pub(crate) struct RouteView {
    pub(crate) name: String,
    pub(crate) traffic: PeerSums,
}

/// Process figures read at a scrape.
#[derive(Debug, Default)]
pub(crate) struct Process {
    pub(crate) open_fds: Option<u64>,
    pub(crate) max_fds: Option<u64>,
    pub(crate) resident_bytes: Option<u64>,
    /// User and system CPU time, in seconds.
    pub(crate) cpu_seconds: Option<f64>,
    pub(crate) start_time: f64,
    pub(crate) uptime: Duration,
    pub(crate) workers: usize,
}

/// Prometheus text exposition format 0.0.4: `# HELP` and `# TYPE` before each family,
/// label values escaped.
struct Text<'a>(&'a mut String);

impl Text<'_> {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                self.0.push_str(k);
                self.0.push_str("=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.0.push_str("\\\\"),
                        '"' => self.0.push_str("\\\""),
                        '\n' => self.0.push_str("\\n"),
                        c => self.0.push(c),
                    }
                }
                self.0.push('"');
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], bounds: &[f64; 15], h: &Summed) {
        let mut cumulative = 0;
        let bucket = format!("{name}_bucket");
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative);
        }
        self.sample(&format!("{name}_sum"), labels, h.sum_ns as f64 / 1e9);
        self.sample(&format!("{name}_count"), labels, cumulative);
    }
}

/// Sums the users of all workers; the `max` with the most traffic keep their names, the
/// rest are added up under `other` (so is a user actually named `other`).
fn users(workers: &[Arc<WorkerStats>], max: usize) -> Vec<(String, [u64; 6])> {
    let mut by_name: HashMap<String, [u64; 6]> = HashMap::new();
    let mut other = [0u64; 6];
    let add = |into: &mut [u64; 6], u: &UserStats| {
        for (sum, c) in into.iter_mut().zip([
            &u.requests,
            &u.bytes_in,
            &u.bytes_out,
            &u.opened,
            &u.closed,
            &u.denied,
        ]) {
            *sum += c.get();
        }
    };
    for w in workers {
        for (name, u) in w.users.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            add(by_name.entry(name.to_string()).or_default(), u);
        }
        add(&mut other, &w.overflow);
    }
    let mut list: Vec<_> = by_name.into_iter().collect();
    list.sort_by(|a, b| (b.1[1] + b.1[2]).cmp(&(a.1[1] + a.1[2])).then_with(|| a.0.cmp(&b.0)));
    let mut out = Vec::new();
    for (name, figures) in list {
        if out.len() < max && name != "other" {
            out.push((name, figures));
        } else {
            for (sum, v) in other.iter_mut().zip(figures) {
                *sum += v;
            }
        }
    }
    if other.iter().any(|&v| v > 0) {
        out.push(("other".into(), other));
    }
    out
}

/// The families of parents' or routes' counts: requests by status class, bytes each way,
/// exchanges and tunnels in flight.
fn peers<'a>(
    t: &mut Text<'_>,
    what: &str,
    through: &str,
    list: impl Iterator<Item = (&'static str, &'a str, &'a PeerSums)> + Clone,
) {
    let name = format!("rustle_{what}_requests_total");
    t.family(
        &name,
        "counter",
        &format!(
            "Requests, tunnels and sessions {through} ended, by status class (SOCKS, \
             relays: 2xx once set up)."
        ),
    );
    for (key, n, sums) in list.clone() {
        for (c, code) in CLASSES.iter().enumerate() {
            t.sample(&name, &[(key, n), ("code", code)], sums.requests[c]);
        }
    }
    let name = format!("rustle_{what}_bytes_total");
    t.family(
        &name,
        "counter",
        &format!("Bytes {through}: up (from clients) and down (to clients)."),
    );
    for (key, n, sums) in list.clone() {
        t.sample(&name, &[(key, n), ("direction", "up")], sums.up);
        t.sample(&name, &[(key, n), ("direction", "down")], sums.down);
    }
    let name = format!("rustle_{what}_active_connections");
    t.family(&name, "gauge", &format!("Exchanges and tunnels {through} in flight."));
    for (key, n, sums) in list {
        t.sample(&name, &[(key, n)], sums.active);
    }
}

/// Writes every metric in the text format.
pub(crate) fn render(s: &Scrape<'_>) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let mut t = Text(&mut out);
    let sum = |f: &dyn Fn(&ListenerStats) -> u64, l: &ListenerLabel| -> u64 { l.counters.sum(f) };
    type Per = (&'static str, &'static str, &'static str, fn(&ListenerStats) -> u64);
    let simple: [Per; 6] = [
        ("rustle_listener_connections_accepted_total", "counter", "Connections accepted.", |l| {
            l.accepted.get()
        }),
        ("rustle_listener_connections_open", "gauge", "Connections open.", |l| {
            l.accepted.get().saturating_sub(l.closed.get())
        }),
        (
            "rustle_listener_bytes_in_total",
            "counter",
            "Bytes from clients passed on upstream (request bodies, tunnels, datagrams).",
            |l| l.bytes_in.get(),
        ),
        (
            "rustle_listener_bytes_out_total",
            "counter",
            "Bytes from upstreams passed on to clients (response bodies, tunnels, datagrams).",
            |l| l.bytes_out.get(),
        ),
        (
            "rustle_listener_tls_handshakes_total",
            "counter",
            "TLS handshakes with clients, completed or not.",
            |l| l.tls_handshakes.get(),
        ),
        (
            "rustle_listener_tls_handshake_failures_total",
            "counter",
            "TLS handshakes with clients that failed.",
            |l| l.tls_failures.get(),
        ),
    ];
    for (name, kind, help, f) in simple {
        t.family(name, kind, help);
        for l in s.listeners {
            t.sample(name, &[("listener", &l.name), ("kind", l.kind)], sum(&f, l));
        }
    }
    let name = "rustle_listener_http2_streams_total";
    t.family(name, "counter", "HTTP/2 streams opened by clients.");
    for l in s.listeners {
        let n = sum(&|l| l.h2_streams.get(), l);
        t.sample(name, &[("listener", &l.name), ("kind", l.kind)], n);
    }
    let name = "rustle_listener_refused_total";
    t.family(
        name,
        "counter",
        "Requests and connections refused: limit (connection limits), rule (access rules, \
         routes, built-in protections), auth (missing or failed authentication).",
    );
    for l in s.listeners {
        for (c, cause) in CAUSES.iter().enumerate() {
            let n = sum(&|l| l.refused[c].get(), l);
            t.sample(name, &[("listener", &l.name), ("kind", l.kind), ("cause", cause)], n);
        }
    }
    let name = "rustle_listener_requests_total";
    t.family(
        name,
        "counter",
        "Requests, tunnels and sessions ended (one per access-log line), by protocol and \
         status class (SOCKS, relays and UDP: 2xx once set up, else their error's HTTP status).",
    );
    for l in s.listeners {
        for (p, proto) in PROTOCOLS.iter().enumerate() {
            for (c, code) in CLASSES.iter().enumerate() {
                let n = sum(&|l| l.requests[p][c].get(), l);
                // Only the protocols a listener has served, to keep the output short.
                if n > 0 {
                    let labels = [
                        ("listener", l.name.as_str()),
                        ("kind", l.kind),
                        ("protocol", *proto),
                        ("code", code),
                    ];
                    t.sample(name, &labels, n);
                }
            }
        }
    }
    let users = users(s.workers, s.max_user_series);
    type UserMetric = (&'static str, &'static str, &'static str, fn(&[u64; 6]) -> u64);
    let per_user: [UserMetric; 5] = [
        ("rustle_user_requests_total", "counter", "Requests and tunnels of the user.", |f| f[0]),
        ("rustle_user_bytes_in_total", "counter", "Bytes from the user passed on upstream.", |f| {
            f[1]
        }),
        ("rustle_user_bytes_out_total", "counter", "Bytes passed on to the user.", |f| f[2]),
        ("rustle_user_connections_open", "gauge", "Connections authenticated as the user.", |f| {
            f[3].saturating_sub(f[4])
        }),
        ("rustle_user_denied_total", "counter", "Requests of the user refused.", |f| f[5]),
    ];
    for (name, kind, help, f) in per_user {
        t.family(
            name,
            kind,
            &format!(
                "{help} The {} users with the most traffic by name, the rest as \"other\".",
                s.max_user_series
            ),
        );
        for (user, figures) in &users {
            t.sample(name, &[("user", user)], f(figures));
        }
    }
    // Quotas: a series per (quota, user) with usage, at most `max_user_series` of them.
    let quotas = &s.quotas[..s.quotas.len().min(s.max_user_series)];
    type Q = (&'static str, &'static str, fn(&(String, String, u64, u64, bool)) -> u64);
    let per_quota: [Q; 3] = [
        ("rustle_quota_used_bytes", "Bytes the user used of the quota in its period.", |q| q.2),
        ("rustle_quota_limit_bytes", "Bytes the quota allows the user (top-ups included).", |q| {
            q.3
        }),
        ("rustle_quota_exceeded", "1 when the user's quota is used up.", |q| u64::from(q.4)),
    ];
    for (name, help, f) in per_quota {
        t.family(name, "gauge", help);
        for q in quotas {
            t.sample(name, &[("quota", &q.0), ("user", &q.1)], f(q));
        }
    }
    t.family("rustle_parent_up", "gauge", "1 when the parent is up, 0 while marked down.");
    for p in s.parents {
        t.sample("rustle_parent_up", &[("parent", &p.name)], u8::from(p.up));
    }
    let name = "rustle_parent_connect_failures_total";
    t.family(name, "counter", "Connections through the parent (and probes) that failed at it.");
    for p in s.parents {
        t.sample(name, &[("parent", &p.name)], p.failures);
    }
    let name = "rustle_parent_connect_seconds";
    t.family(
        name,
        "histogram",
        "Time to a new connection through the parent (the whole chain it was part of).",
    );
    for p in s.parents {
        t.histogram(name, &[("parent", &p.name)], &LATENCY_BUCKETS, &p.connect);
    }
    let name = "rustle_parent_probe_duration_seconds";
    t.family(name, "gauge", "How long the parent's last health probe took, failed or not.");
    for p in s.parents {
        if let Some(d) = p.probe {
            t.sample(name, &[("parent", &p.name)], d.as_secs_f64());
        }
    }
    let parents = s.parents.iter().map(|p| ("parent", p.name.as_str(), &p.traffic));
    let routes = s.routes.iter().map(|r| ("route", r.name.as_str(), &r.traffic));
    peers(&mut t, "parent", "through the parent", parents);
    peers(&mut t, "route", "sent by the route through parents", routes);
    type Hist = (&'static str, &'static str, &'static [f64; 15], fn(&WorkerStats) -> &Histogram);
    let name = "rustle_request_duration_seconds";
    t.family(
        name,
        "histogram",
        "End-to-end duration of requests and other exchanges that are not tunnels, from the \
         request head read to the exchange's end, by protocol.",
    );
    for (i, proto) in PROTOCOLS.iter().enumerate() {
        let mut summed = Summed::default();
        for w in s.workers {
            w.request[i].add_to(&mut summed);
        }
        // Only the protocols served, to keep the output short.
        if summed.counts.iter().any(|&c| c > 0) {
            t.histogram(name, &[("protocol", *proto)], &LATENCY_BUCKETS, &summed);
        }
    }
    let histograms: [Hist; 3] = [
        (
            "rustle_upstream_connect_seconds",
            "Time to a new upstream connection (resolving, connecting, TLS, parents).",
            &LATENCY_BUCKETS,
            |w| &w.connect,
        ),
        (
            "rustle_upstream_response_head_seconds",
            "Time from sending a request upstream to its response head.",
            &LATENCY_BUCKETS,
            |w| &w.head,
        ),
        ("rustle_tunnel_duration_seconds", "How long tunnels lasted.", &DURATION_BUCKETS, |w| {
            &w.tunnel
        }),
    ];
    for (name, help, bounds, h) in histograms {
        t.family(name, "histogram", help);
        let mut summed = Summed::default();
        for w in s.workers {
            h(w).add_to(&mut summed);
        }
        t.histogram(name, &[], bounds, &summed);
    }
    let p = s.process;
    t.family("rustle_workers", "gauge", "Worker threads.");
    t.sample("rustle_workers", &[], p.workers);
    t.family("rustle_uptime_seconds", "gauge", "Seconds since the proxy started.");
    t.sample("rustle_uptime_seconds", &[], p.uptime.as_secs_f64());
    let name = "rustle_config_reloads_total";
    t.family(name, "counter", "Configuration reloads applied.");
    t.sample(name, &[], RELOADS.load(Relaxed));
    let name = "rustle_config_reload_failures_total";
    t.family(name, "counter", "Configuration reloads refused (the previous one kept).");
    t.sample(name, &[], RELOAD_FAILURES.load(Relaxed));
    let name = "rustle_config_last_reload_successful";
    t.family(name, "gauge", "1 if the last reload was applied (or none was asked), 0 if refused.");
    t.sample(name, &[], LAST_RELOAD_OK.load(Relaxed));
    let name = "rustle_auth_hashes_total";
    t.family(name, "counter", "Password hashes computed (bcrypt, argon2id).");
    t.sample(name, &[], AUTH_HASHES.load(Relaxed));
    let name = "rustle_auth_hashes_refused_total";
    t.family(name, "counter", "Password checks refused a place on the hashing threads.");
    t.sample(name, &[], AUTH_HASHES_REFUSED.load(Relaxed));
    let name = "rustle_config_last_reload_success_timestamp_seconds";
    t.family(
        name,
        "gauge",
        "When the configuration in force was loaded (the last reload applied, or the \
         start), since the Unix epoch, in seconds.",
    );
    let last = LAST_RELOAD_MS.load(Relaxed);
    let loaded = if last == 0 { p.start_time } else { last as f64 / 1e3 };
    t.sample(name, &[], loaded);
    let name = "rustle_build_info";
    t.family(name, "gauge", "Always 1: the version of the running rustle, as labels.");
    t.sample(name, &[("version", env!("CARGO_PKG_VERSION"))], 1);
    let name = "process_start_time_seconds";
    t.family(name, "gauge", "Start time of the process since the Unix epoch, in seconds.");
    t.sample(name, &[], p.start_time);
    if let Some(cpu) = p.cpu_seconds {
        let name = "process_cpu_seconds_total";
        t.family(name, "counter", "Total user and system CPU time spent in seconds.");
        t.sample(name, &[], cpu);
    }
    let optional = [
        ("process_open_fds", "Open file descriptors.", p.open_fds),
        ("process_max_fds", "The open-file limit (soft).", p.max_fds),
        ("process_resident_memory_bytes", "Resident memory size in bytes.", p.resident_bytes),
    ];
    for (name, help, value) in optional {
        if let Some(v) = value {
            t.family(name, "gauge", help);
            t.sample(name, &[], v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Protocol, Version};
    use crate::telemetry::metrics::*;
    use std::time::Instant;

    #[test]
    fn counting_on_a_worker_thread_and_rendering() {
        // Exchanges are counted while an admin endpoint can read them.
        set_timed();
        let stats = WorkerStats::new();
        let counters = ListenerCounters::new(1);
        let (for_thread, c) = (stats.clone(), counters.clone());
        std::thread::spawn(move || {
            install(0, for_thread);
            accepted(&c);
            accepted(&c);
            closed(&c);
            // A listener with no slot for this worker: ignored, not a panic.
            accepted(&ListenerCounters::default());
            let conn = user_connection("ann");
            ended(&End {
                listener: &c,
                protocol: Protocol::Http,
                version: Version::Http11,
                status: 200,
                up: 10,
                down: 1000,
                user: Some("ann"),
                refused: None,
                tunnel: None,
                start: Instant::now(),
                through: None,
            });
            ended(&End {
                listener: &c,
                protocol: Protocol::Connect,
                version: Version::Http11,
                status: 403,
                up: 0,
                down: 0,
                user: Some("bob\"\n"),
                refused: Some(Refused::Rule),
                tunnel: Some(Instant::now()),
                start: Instant::now(),
                through: None,
            });
            response_head(Duration::from_millis(3));
            drop(conn);
        })
        .join()
        .expect("the worker thread");
        let listeners = [ListenerLabel { name: "127.0.0.1:1".into(), kind: "http", counters }];
        let text = render(&Scrape {
            quotas: &[],
            listeners: &listeners,
            workers: &[stats],
            max_user_series: 1,
            parents: &[],
            routes: &[],
            process: &Process::default(),
        });
        let l = "listener=\"127.0.0.1:1\",kind=\"http\"";
        for line in [
            format!("rustle_listener_connections_accepted_total{{{l}}} 2"),
            format!("rustle_listener_connections_open{{{l}}} 1"),
            format!("rustle_listener_requests_total{{{l},protocol=\"http1\",code=\"2xx\"}} 1"),
            format!("rustle_listener_requests_total{{{l},protocol=\"connect\",code=\"4xx\"}} 1"),
            format!("rustle_listener_refused_total{{{l},cause=\"rule\"}} 1"),
            format!("rustle_listener_bytes_out_total{{{l}}} 1000"),
            // ann has the most traffic and keeps her name; bob is summed under other.
            "rustle_user_bytes_out_total{user=\"ann\"} 1000".into(),
            "rustle_user_denied_total{user=\"other\"} 1".into(),
            "rustle_user_connections_open{user=\"ann\"} 0".into(),
            "rustle_upstream_response_head_seconds_bucket{le=\"0.0025\"} 0".into(),
            "rustle_upstream_response_head_seconds_bucket{le=\"0.005\"} 1".into(),
            "rustle_upstream_response_head_seconds_bucket{le=\"+Inf\"} 1".into(),
            "rustle_upstream_response_head_seconds_count 1".into(),
            "rustle_tunnel_duration_seconds_count 1".into(),
        ] {
            assert!(text.lines().any(|t| t == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn the_grafana_dashboard_names_only_metrics_that_exist() {
        let text = render(&Scrape {
            quotas: &[],
            listeners: &[],
            workers: &[],
            max_user_series: 1,
            parents: &[],
            routes: &[],
            process: &Process {
                open_fds: Some(1),
                max_fds: Some(2),
                resident_bytes: Some(3),
                cpu_seconds: Some(4.0),
                ..Default::default()
            },
        });
        let dashboard = include_str!("../../../../../contrib/grafana-rustle.json");
        let mut seen = 0;
        for (i, _) in dashboard.match_indices(['r', 'p']) {
            let rest = &dashboard[i..];
            if !(rest.starts_with("rustle_") || rest.starts_with("process_")) {
                continue;
            }
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            let name = &rest[..end.unwrap_or(rest.len())];
            let family = name.strip_suffix("_bucket").unwrap_or(name);
            assert!(text.contains(&format!("# TYPE {family} ")), "{name} is not exported");
            seen += 1;
        }
        assert!(seen > 20, "{seen}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        Text(&mut out).sample("m", &[("user", "a\"b\\c\nd")], 1);
        assert_eq!(out, "m{user=\"a\\\"b\\\\c\\nd\"} 1\n");
    }
}
