//! The report's families of scenarios and the two profiles that run them:
//! `full` (every family, every peer that supports it: the data behind
//! BENCHMARKS.md) and `quick` (a few cells of a few families, minutes: CI's
//! check that the harness and the report still work end to end).
//!
//! A family is one section of the report. Its plan says which scenarios run
//! against which proxies, how often, for how long and over which link; the
//! report reads the family of each row from the CSV's `stage` column and
//! its title and text from [`FAMILIES`].

/// Which profile `--profile` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileName {
    /// Every family with every peer that supports it, three repetitions (fewer for memory
    /// and the soak): under two hours on a 2-core machine.
    Full,
    /// A few cells of a few families, one short repetition each, on
    /// loopback: a few minutes.
    Quick,
}

/// The link between the client and the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Network namespaces joined by veths, no emulation (loopback where
    /// namespaces cannot be made).
    Plain,
    /// Loopback, no namespaces.
    Loopback,
    /// The reference's slow link on the client side: netem delay and loss
    /// and a rate limit, segmentation offload off.
    Slow,
}

/// netem settings of [`Link::Slow`], each way on the client's link.
pub const SLOW_NETEM: &str = "delay 5ms loss 0.5%";
/// Rate of [`Link::Slow`]: the client link's bandwidth.
pub const SLOW_RATE: &str = "1gbit";

/// What one profile runs of one family.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// `--scenarios` list (names and groups).
    pub scenarios: &'static str,
    /// `--proxies` list.
    pub proxies: &'static str,
    pub reps: u32,
    /// `--duration` of each run.
    pub duration: &'static str,
    pub link: Link,
}

/// How the report presents a family's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Throughput, CPU per unit and latency per proxy.
    Peers,
    /// As `Peers`, latency percentiles first: fixed-rate loads.
    Latency,
    /// Memory per open tunnel.
    Memory,
    /// Requests per CPU-second with one and two workers.
    Scaling,
    /// rustle against rustle with one feature on: the cost of the feature.
    Variants,
    /// rustle alone, its second scenario against its first (HTTP/2 against
    /// HTTP/1.1 on one port).
    Pair,
}

/// One section of the report.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub id: &'static str,
    pub title: &'static str,
    /// What is measured and how, one paragraph of the report.
    pub about: &'static str,
    pub view: View,
    pub full: Plan,
    /// `None`: the quick profile leaves the family out.
    pub quick: Option<Plan>,
}

const fn plan(scenarios: &'static str, proxies: &'static str) -> Plan {
    Plan { scenarios, proxies, reps: 3, duration: "5s", link: Link::Plain }
}

const fn quick(scenarios: &'static str, proxies: &'static str) -> Option<Plan> {
    Some(Plan { scenarios, proxies, reps: 1, duration: "2s", link: Link::Loopback })
}

/// Every family, in the order of the report.
pub const FAMILIES: &[Family] = &[
    Family {
        id: "http",
        title: "HTTP proxy",
        about: "Absolute-form GET requests through each proxy's HTTP port to the origin, \
                answers of 1 KB, 10 KB and 1 MB; `ka`: 64 kept-alive client connections \
                (16 for 1 MB), `close`: a new client connection per request.",
        view: View::Peers,
        full: plan(
            "http-ka-1k,http-ka-10k,http-ka-1m,http-close-1k,http-close-10k,http-close-1m",
            "rustle,nginx,haproxy,squid,tinyproxy,floor",
        ),
        quick: quick("http-ka-1k", "rustle,nginx,floor"),
    },
    Family {
        id: "tunnels",
        title: "CONNECT, SOCKS5 and the TCP relay: small exchanges",
        about: "One 1 KB HTTP exchange after another inside CONNECT tunnels, SOCKS5 tunnels \
                and through a plain TCP relay; `ka`: 64 tunnels each carrying request after \
                request, `close`: a new tunnel per request.",
        view: View::Peers,
        full: plan(
            "connect-ka-1k,connect-close-1k,socks-ka-1k,socks-close-1k,relay-ka-1k,relay-close-1k",
            "rustle,nginx,haproxy,haproxy-splice,squid,tinyproxy,dante,microsocks,floor",
        ),
        quick: quick("connect-ka-1k,socks-ka-1k", "rustle,squid,dante"),
    },
    Family {
        id: "streams",
        title: "Bulk streams",
        about: "One connection, or sixteen at once, moving data as fast as they can through \
                each kind of tunnel: `down` 1 GiB answers (64 MiB each for sixteen), `up` \
                uploads of the same sizes; Gbit/s, and the proxy's CPU per gigabyte.",
        view: View::Peers,
        full: plan(
            "relay-stream1-down,relay-stream1-up,relay-stream16,relay-stream16-up,\
             connect-stream1-down,connect-stream1-up,connect-stream16,connect-stream16-up,\
             socks-stream1-down,socks-stream1-up,socks-stream16,socks-stream16-up",
            "rustle,nginx,haproxy,haproxy-splice,squid,dante,floor",
        ),
        quick: None,
    },
    Family {
        id: "tls",
        title: "TLS relays",
        about: "TLS 1.3 ended in the proxy (`term`: TLS from the client, plain TCP to the \
                origin) or begun in it (`orig`: plain TCP from the client, TLS to the HTTPS \
                origin), 1 KB and 1 MB answers on kept-alive connections, and a new \
                connection per request with a full handshake each time (`close`) or with a \
                client that resumes its sessions as browsers and wrk do (`resume-close`). \
                `-ktls` variants hand the session keys to the kernel after the handshake.",
        view: View::Peers,
        full: plan(
            "tls-term-1k,tls-term-1m,tls-term-close,tls-term-resume-close,\
             tls-orig-1k,tls-orig-1m,tls-orig-close",
            "rustle,rustle-ktls,nginx,nginx-ktls,haproxy,stunnel",
        ),
        quick: None,
    },
    Family {
        id: "ws",
        title: "WebSocket",
        about: "WebSocket upgrades through the HTTP proxy port to the origin's echo: 64-byte \
                messages on 64 connections (the scenario of the published rustle \
                comparison), 64 KB messages on 16, and a new connection per message.",
        view: View::Peers,
        full: plan("ws-64b,ws-64k,ws-close", "rustle,nginx,haproxy"),
        quick: quick("ws-64b", "rustle"),
    },
    Family {
        id: "h2",
        title: "HTTP/2 and HTTP/1.1 on one TLS port",
        about: "One TLS listener of rustle's HTTP proxy offering both protocols: clients \
                speaking HTTP/2 (ALPN h2, many streams on few connections) against clients \
                speaking HTTP/1.1 (ALPN http/1.1, kept-alive connections), 1 KB answers.",
        view: View::Pair,
        full: plan("h1-tls-1k,h2-tls-1k", "rustle"),
        quick: None,
    },
    Family {
        id: "mix",
        title: "Idle tunnels and active exchanges",
        about: "As many idle tunnels as the file limit allows held open through the proxy \
                (9,700, beside the 200 active connections: two sockets each in the proxy \
                under its 20,000 files), while the active connections ask for 10 KB answers \
                at a fixed 2,000 a second: the active exchanges' latency percentiles, the \
                proxy's CPU per exchange and its memory with the tunnels held.",
        view: View::Latency,
        full: plan(
            "idle-connect-9700,idle-socks-9700,idle-relay-9700",
            "rustle,nginx,haproxy,squid,tinyproxy,dante",
        ),
        quick: None,
    },
    Family {
        id: "clients",
        title: "2,000 clients at a fixed rate",
        about: "2,000 connections open at once asking for 10 KB answers at a fixed 3,000 \
                exchanges a second (an open loop: a slow proxy builds a queue rather than \
                getting less load), latency percentiles of the exchanges.",
        view: View::Latency,
        full: plan(
            "mix-http-3k,mix-connect-3k,mix-socks-3k,mix-relay-3k",
            "rustle,nginx,haproxy,squid,tinyproxy,dante",
        ),
        quick: None,
    },
    Family {
        id: "slow",
        title: "A slow emulated link, with and without the grace delay",
        about: "The client's link shaped as the reference did (netem `delay 5ms loss 0.5%` \
                each way, the client link limited to 1 Gbit/s, segmentation offload off): one \
                download stream and sixteen upload streams through the relay, and the \
                fixed-rate mixes. `rustle-grace` waits 2 ms after 3 small reads in a row \
                before reading again (3proxy's `-g8000,3,2`), so data gathers into fewer, \
                larger reads.",
        view: View::Latency,
        full: Plan {
            scenarios: "relay-stream1-down,relay-stream16-up,mix-relay-3k,mix-http-3k",
            proxies: "rustle,rustle-grace,nginx",
            reps: 3,
            duration: "10s",
            link: Link::Slow,
        },
        quick: None,
    },
    Family {
        id: "memory",
        title: "Memory per idle tunnel",
        about: "1,000, 5,000 and 9,900 CONNECT and SOCKS5 tunnels opened, each used for one \
                small request and then left idle: the proxy's resident memory with them open, \
                minus before, per tunnel.",
        view: View::Memory,
        full: Plan {
            scenarios: "mem-tunnels-1000,mem-tunnels-5000,mem-tunnels-9900",
            proxies: "rustle,squid,tinyproxy,dante,microsocks",
            reps: 2,
            duration: "6s",
            link: Link::Plain,
        },
        quick: quick("mem-tunnels-connect-1000", "rustle"),
    },
    Family {
        id: "scaling",
        title: "One worker and two",
        about: "The small-exchange scenarios with one worker (thread or process) and with \
                two (`rustle-2w`: `--workers 2`, `nginx-2w`: `worker_processes 2`, \
                `haproxy-2t`: `nbthread 2`), as requests per CPU-second of the proxy: on a \
                2-core machine that also runs the client and the origin, two workers cannot \
                double the rate, but this shows whether the second one costs CPU per request.",
        view: View::Scaling,
        full: plan(
            "http-ka-1k,http-close-1k,connect-ka-1k,socks-ka-1k,relay-ka-1k",
            "rustle,rustle-2w,nginx,nginx-2w,haproxy,haproxy-2t",
        ),
        quick: None,
    },
    Family {
        id: "parents",
        title: "Through parent proxies",
        about: "rustle alone against rustle forwarding to one parent rustle and to a chain of \
                two, each process with one worker; the CPU is that of every rustle process on \
                the path.",
        view: View::Variants,
        full: plan("http-ka-1k,connect-ka-1k", "rustle,rustle-parent1,rustle-parent2"),
        quick: quick("http-ka-1k", "rustle,rustle-parent1"),
    },
    Family {
        id: "metrics",
        title: "Metrics scraped every second",
        about: "rustle with its Prometheus endpoint scraped once a second during the run, \
                against rustle without the endpoint.",
        view: View::Variants,
        full: plan("http-ka-1k,connect-ka-1k", "rustle,rustle-metrics"),
        quick: None,
    },
    Family {
        id: "users",
        title: "Users: authentication, callback cache, quotas and egress rotation",
        about: "rustle with no users against: every request authenticated from a users file \
                (`rustle-auth`); users checked by an HTTP callback whose answers are cached \
                (`rustle-auth-http`); users with traffic accounting and quotas kept on disk \
                (`rustle-quota`); the outgoing address rotated over four addresses \
                (`rustle-egress`).",
        view: View::Variants,
        full: plan(
            "http-ka-1k,connect-ka-1k,socks-ka-1k",
            "rustle,rustle-auth,rustle-auth-http,rustle-quota,rustle-egress",
        ),
        quick: None,
    },
    Family {
        id: "kernel",
        title: "Tunnels forwarded in the kernel",
        about: "rustle relaying in user space against `rustle-kernel`, whose busy tunnels are \
                handed to a BPF program that forwards them inside the kernel \
                (`kernel_forwarding = \"auto\"`), and haproxy splicing. The proxy's CPU \
                excludes the kernel's work done outside its processes.",
        view: View::Variants,
        full: plan(
            "relay-stream16,connect-stream1-down,connect-ka-1k",
            "rustle,rustle-kernel,haproxy-splice",
        ),
        quick: None,
    },
    Family {
        id: "udp",
        title: "UDP",
        about: "64-byte datagrams echoed through SOCKS5 UDP ASSOCIATE and through the UDP \
                relay, one in flight per client socket, 64 sockets.",
        view: View::Peers,
        full: plan("udp-socks-64b,udp-relay-64b", "rustle,dante"),
        quick: None,
    },
    Family {
        id: "soak",
        title: "Soak",
        about: "9,700 idle tunnels and a steady 2,000 exchanges a second through CONNECT for \
                three minutes: errors, latency and the proxy's memory with the tunnels held.",
        view: View::Latency,
        full: Plan {
            scenarios: "idle-connect-9700",
            proxies: "rustle",
            reps: 1,
            duration: "180s",
            link: Link::Plain,
        },
        quick: None,
    },
];

/// The family `id`, if there is one.
pub fn family(id: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.id == id)
}

impl Family {
    pub fn plan(&self, profile: ProfileName) -> Option<Plan> {
        match profile {
            ProfileName::Full => Some(self.full),
            ProfileName::Quick => self.quick,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_family_is_named_once_and_its_plans_parse() {
        for (i, f) in FAMILIES.iter().enumerate() {
            assert!(FAMILIES[..i].iter().all(|g| g.id != f.id), "{} twice", f.id);
            for p in [Some(f.full), f.quick].into_iter().flatten() {
                let scenarios = super::super::scenario::expand(p.scenarios).unwrap();
                assert!(!scenarios.is_empty(), "{}", f.id);
                for name in p.proxies.split(',') {
                    assert!(super::super::peers::KNOWN.contains(&name), "{}: {name}", f.id);
                }
                assert!(p.reps >= 1 && crate::load::cli::duration(p.duration).is_ok());
            }
        }
        assert!(family("http").is_some() && family("nope").is_none());
        assert!(FAMILIES.iter().filter(|f| f.quick.is_some()).count() >= 3);
    }
}
