//! Where the three roles live: on loopback, or in three network namespaces
//! of our own joined by veth pairs,
//!
//! ```text
//! client 198.18.1.2 ── 198.18.1.1 proxy 198.18.2.1 ── 198.18.2.2 origin
//! ```
//!
//! so that no two roles share a loopback and every proxy is crossed by the
//! same path. The addresses are from 198.18.0.0/15, the range set aside for
//! benchmarking (RFC 2544), and exist only inside the namespaces, which are
//! deleted (taking their veths with them) at the end or on interruption.

use std::process::Command;

use anyhow::{bail, Context, Result};

use super::children;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Client,
    Proxy,
    Origin,
}

pub(super) struct Net {
    /// Namespace names (client, proxy, origin), or None on loopback.
    ns: Option<[String; 3]>,
    /// The proxy's veth towards the origin (in its namespace).
    proxy_outer: String,
    /// Link emulation applied to the client link, for the records.
    pub link: String,
    /// Notes for the conditions file (ethtool missing, ...).
    pub notes: Vec<String>,
}

impl Net {
    pub(super) fn loopback() -> Net {
        Net { ns: None, proxy_outer: String::new(), link: String::new(), notes: Vec::new() }
    }

    pub(super) fn is_netns(&self) -> bool {
        self.ns.is_some()
    }

    pub(super) fn kind(&self) -> &'static str {
        if self.is_netns() {
            "netns"
        } else {
            "loopback"
        }
    }

    /// The address a role listens on (proxy: towards the client).
    pub(super) fn ip(&self, role: Role) -> &'static str {
        match (self.is_netns(), role) {
            (false, _) => "127.0.0.1",
            (true, Role::Client) => "198.18.1.2",
            (true, Role::Proxy) => "198.18.1.1",
            (true, Role::Origin) => "198.18.2.2",
        }
    }

    /// The proxy's own address on the origin side (dante's `external`).
    pub(super) fn proxy_external_ip(&self) -> &'static str {
        if self.is_netns() {
            "198.18.2.1"
        } else {
            "127.0.0.1"
        }
    }

    /// `n` addresses the proxy can send from towards the origin: on loopback
    /// 127.0.0.2 onwards (all of 127/8 is local); in the namespaces its outer
    /// address and the ones after the origin's in 198.18.2.0/24, added to its
    /// outer veth (again: `replace` leaves an address already there as it is).
    pub(super) fn egress_ips(&self, n: usize) -> Result<Vec<String>> {
        let Some(ns) = &self.ns else {
            return Ok((0..n).map(|i| format!("127.0.0.{}", 2 + i)).collect());
        };
        let mut v = vec![self.proxy_external_ip().to_string()];
        for i in 1..n {
            let addr = format!("198.18.2.{}", 2 + i);
            let cidr = format!("{addr}/24");
            ip(&["-n", &ns[1], "addr", "replace", &cidr, "dev", &self.proxy_outer])?;
            v.push(addr);
        }
        v.truncate(n);
        Ok(v)
    }

    /// The argv prefix that runs a program inside the role's namespace (if
    /// any) pinned to `cpu` with taskset. `ip netns exec` and `taskset` both
    /// exec, so the child's pid is the program's own.
    pub(super) fn prefix(&self, role: Role, cpu: &str) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        if let Some(ns) = &self.ns {
            let i = match role {
                Role::Client => 0,
                Role::Proxy => 1,
                Role::Origin => 2,
            };
            v.extend(["ip", "netns", "exec", &ns[i]].map(String::from));
        }
        v.extend(["taskset", "-c", cpu].map(String::from));
        v
    }

    /// [`Net::prefix`] followed by `program`, as a Command.
    pub(super) fn command(&self, role: Role, cpu: &str, program: &str) -> Command {
        let pre = self.prefix(role, cpu);
        let mut c = Command::new(&pre[0]);
        c.args(&pre[1..]).arg(program);
        c
    }

    /// Creates the namespaces and links. `netem` is tc netem arguments
    /// (`delay 1ms loss 0.1%`), `rate` a bandwidth (`100mbit`); both are
    /// applied to both ends of the client link, so each way. `offload` false
    /// turns GSO/TSO/GRO off on every veth.
    pub(super) fn create(netem: Option<&str>, rate: Option<&str>, offload: bool) -> Result<Net> {
        let tag = std::process::id();
        let names = [format!("rbc-{tag}"), format!("rbp-{tag}"), format!("rbo-{tag}")];
        // Set before anything exists: on an early error Drop deletes what was
        // made (deleting a namespace that is not there is harmless).
        let mut net = Net {
            ns: Some(names.clone()),
            proxy_outer: format!("rb{tag}po"),
            link: String::new(),
            notes: Vec::new(),
        };
        net.notes.push(match offload {
            true => "veth offloads (GSO, TSO, GRO) left as the kernel sets them".into(),
            false => "veth offloads (GSO, TSO, GRO) turned off".into(),
        });
        for n in &names {
            children::register_netns(n);
            ip(&["netns", "add", n])?;
        }
        let [c, p, o] = &names;
        let links = [
            (format!("rb{tag}c"), format!("rb{tag}pc"), c, p, "198.18.1.2/24", "198.18.1.1/24"),
            (format!("rb{tag}o"), format!("rb{tag}po"), o, p, "198.18.2.2/24", "198.18.2.1/24"),
        ];
        for (a, b, ns_a, ns_b, ip_a, ip_b) in &links {
            ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
            let moved = ip(&["link", "set", a, "netns", ns_a])
                .and_then(|_| ip(&["link", "set", b, "netns", ns_b]));
            if let Err(e) = moved {
                // Still in the root namespace: remove it here (takes its peer).
                let _ = ip(&["link", "del", a]);
                let _ = ip(&["link", "del", b]);
                return Err(e);
            }
            for (ns, dev, addr) in [(ns_a, a, ip_a), (ns_b, b, ip_b)] {
                ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
                ip(&["-n", ns, "link", "set", dev, "up"])?;
                if !offload {
                    net.offload_off(ns, dev);
                }
            }
        }
        for n in &names {
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        // The client opens tens of thousands of connections to the same proxy address in a
        // few minutes (held tunnels, a new connection per request), and the proxy as many to
        // the origin, each left in TIME_WAIT on the side that closed first: reuse those and
        // widen the port range, in those two namespaces only, so that a run does not fail
        // to connect because an earlier one used up the ports.
        let tune = |ns: &str| {
            Command::new("ip")
                .args(["netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1"])
                .args(["net.ipv4.ip_local_port_range=1024 65000"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let tuned = tune(c) & tune(p);
        net.notes.push(match tuned {
            true => "client and proxy namespaces: tcp_tw_reuse=1, local ports 1024-65000".into(),
            false => {
                "client and proxy namespaces: could not set tcp_tw_reuse (sysctl missing?)".into()
            }
        });
        let mut qdisc: Vec<String> = Vec::new();
        if let Some(n) = netem {
            qdisc.extend(n.split_whitespace().map(String::from));
        }
        if let Some(r) = rate {
            qdisc.extend(["rate".to_string(), r.to_string()]);
        }
        if !qdisc.is_empty() {
            let (a, b) = (&links[0].0, &links[0].1);
            for (ns, dev) in [(c, a), (p, b)] {
                let mut args = vec!["-n", ns, "qdisc", "add", "dev", dev, "root", "netem"];
                args.extend(qdisc.iter().map(String::as_str));
                run("tc", &args)?;
            }
            net.link = qdisc.join(" ");
        }
        Ok(net)
    }

    /// GSO/TSO/GRO off so that the emulated link sees real packet sizes;
    /// skipped with a note when ethtool is not installed.
    fn offload_off(&mut self, ns: &str, dev: &str) {
        if super::sys::which("ethtool").is_none() {
            let note = "ethtool not installed: segmentation offload left on".to_string();
            if !self.notes.contains(&note) {
                self.notes.push(note);
            }
            return;
        }
        let ok = Command::new("ip")
            .args([
                "netns", "exec", ns, "ethtool", "-K", dev, "gso", "off", "tso", "off", "gro", "off",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            self.notes.push(format!("ethtool -K {dev} failed: offload left as it was"));
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(names) = self.ns.take() {
            // Deleting a namespace deletes the veth ends inside it.
            for n in &names {
                let _ = Command::new("ip")
                    .args(["netns", "del", n])
                    .stderr(std::process::Stdio::null())
                    .status();
                children::forget_netns(n);
            }
        }
    }
}

fn ip(args: &[&str]) -> Result<()> {
    run("ip", args)
}

fn run(prog: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(prog).args(args).output().with_context(|| format!("running {prog}"))?;
    if !out.status.success() {
        bail!("{prog} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
