//! The relay engine end to end: a gigabyte through CONNECT, SOCKS5 and the TCP relay with
//! splice on, each compared by sha256 with the same bytes fetched directly from the origin.

use std::process::Stdio;

use rustle::config::KernelForwarding;
use rustle::config::ListenerKind;
use rustle_bench::Origin;

use crate::util::*;

const GIB: u64 = 1 << 30;

/// `curl ARGS | sha256sum`, without holding the gigabyte in memory.
fn curl_sha256(args: &[&str]) -> Option<String> {
    if !have("curl") || !have("sha256sum") {
        return None;
    }
    let mut curl = clean_command("curl")
        .args(["--silent", "--show-error", "--max-time", "120"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run curl");
    let out = clean_command("sha256sum")
        .stdin(curl.stdout.take().expect("curl stdout"))
        .output()
        .expect("run sha256sum");
    assert!(curl.wait().expect("curl exits").success(), "curl {args:?} failed");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    Some(text.split_whitespace().next().unwrap_or_default().to_string())
}

#[test]
fn a_gigabyte_through_connect_socks5_and_the_relay_is_intact() {
    let origin = Origin::start().unwrap();
    let url = origin.url(&format!("/bytes/{GIB}"));
    let Some(direct) = curl_sha256(&[&url]) else { return };
    // The relay (splicing), then the kernel where it can forward (root).
    let mut modes = vec![KernelForwarding::Off];
    if crate::util::peers::is_root() {
        modes.push(KernelForwarding::Require);
    }
    for mode in modes {
        let proxy = Proxy::start_with(|cfg| {
            cfg.listeners = vec![
                listener(ListenerKind::Http, None),
                listener(ListenerKind::Socks, None),
                listener(ListenerKind::Relay, Some(origin.addr())),
            ];
            cfg.relay.kernel_forwarding = mode;
        });
        let [(_, http), (_, socks), (_, relay)] = proxy.addrs() else { panic!("three listeners") };
        let before = (proxy.mode_switches(), proxy.running().kernel_tunnels());
        let via_connect = curl_sha256(&["-p", "-x", &format!("http://{http}"), &url]);
        let via_socks = curl_sha256(&["--socks5", &socks.to_string(), &url]);
        let via_relay = curl_sha256(&[&format!("http://{relay}/bytes/{GIB}")]);
        // And as a plain proxied response: a body of known length, spliced.
        let via_http = curl_sha256(&["-x", &format!("http://{http}"), &url]);
        for (path, got) in [
            ("CONNECT", via_connect),
            ("SOCKS5", via_socks),
            ("relay", via_relay),
            ("HTTP", via_http),
        ] {
            assert_eq!(got.as_deref(), Some(direct.as_str()), "{mode:?}, {path}: it differs");
        }
        // This proxy's own relays: other tests' proxies count in their own.
        let after = (proxy.mode_switches(), proxy.running().kernel_tunnels());
        match mode {
            KernelForwarding::Off => assert!(
                after.0 .0 >= before.0 .0 + 3,
                "the tunnels switched to splice: {before:?} -> {after:?}"
            ),
            _ => assert_eq!(after.1 .0, before.1 .0 + 3, "the kernel took the three tunnels"),
        }
        // A tunnel's line is written as it closes, perhaps after the client has finished.
        let whats = [" CONNECT ", "socks5://", "relay://"];
        let lines = proxy.log_lines_matching(3, |l| whats.iter().any(|w| l.contains(w)));
        for what in whats {
            let line = lines.iter().find(|l| l.contains(what)).expect("a log line per tunnel");
            // The tunnel carried the HTTP exchange: the body plus a response head.
            let down = LogLine::parse(line).down;
            assert!((GIB..GIB + 1024).contains(&down), "{mode:?}, {what}: {down} B logged: {line}");
        }
    }
}
