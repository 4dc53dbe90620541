use std::time::Duration;

use super::*;

#[test]
fn empty_file_is_the_default() {
    let c = Config::parse("").expect("empty config");
    let l = c.effective_listeners();
    assert_eq!(l[0].listen.to_string(), DEFAULT_AUTO);
    assert_eq!(l[0].kind, ListenerKind::Auto);
    assert_eq!(l[1].listen.to_string(), DEFAULT_SOCKS);
    assert_eq!(c.timeouts.header, Duration::from_secs(10));
}

#[test]
fn full_file_parses() {
    let text = "workers = 2\n[[listener]]\nkind = \"http\"\nlisten = \"127.0.0.1:8080\"\n\
                [[listener]]\nlisten = \"[::1]:8081\"\n[log]\naccess = \"off\"\nformat = \"json\"\n\
                [timeouts]\nheader = \"500ms\"\nconnect = 3\n[http]\nvia = true\n";
    let c = Config::parse(text).expect("valid config");
    assert_eq!(c.workers, 2);
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.log.access, LogTarget::Off);
    assert_eq!(c.log.format, LogFormat::Json);
    assert_eq!(c.timeouts.header, Duration::from_millis(500));
    assert_eq!(c.timeouts.connect, Duration::from_secs(3));
    assert!(c.http.via);
}

#[test]
fn unknown_keys_are_all_reported_with_lines() {
    let text = "workerz = 2\n[log]\nformat = \"plain\"\ncolour = true\n\
                [[listener]]\nlisten = \"127.0.0.1:1\"\nport = 3\n";
    let p = Config::parse(text).expect_err("unknown keys");
    let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert!(shown.contains(&"line 1: unknown key `workerz`".to_string()), "{shown:?}");
    assert!(shown.contains(&"line 4: unknown key `log.colour`".to_string()), "{shown:?}");
    assert!(shown.contains(&"line 7: unknown key `listener.0.port`".to_string()), "{shown:?}");
}

#[test]
fn hashing_thread_and_queue_sizes_of_zero_are_refused_with_lines() {
    let c = Config::parse("[auth]\nhash_threads = 1\n").expect("valid");
    assert_eq!(c.auth.hash_threads, 1);
    assert_eq!((c.auth.max_pending_hashes, c.auth.max_hashes_per_client), (64, 2));
    let text = "[auth]\nhash_threads = 0\nmax_pending_hashes = 0\nmax_hashes_per_client = 0\n";
    let p = Config::parse(text).expect_err("zeros");
    let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    for (line, key) in
        [(2, "hash_threads"), (3, "max_pending_hashes"), (4, "max_hashes_per_client")]
    {
        let want = format!("line {line}: auth.{key} must be at least 1");
        assert!(shown.contains(&want), "{want} in {shown:?}");
    }
}

#[test]
fn type_errors_have_lines() {
    let p = Config::parse("\n\n[timeouts]\nheader = \"ten seconds\"\n").expect_err("bad");
    assert_eq!(p[0].line, Some(4), "{p:?}");
    assert!(p[0].message.contains("invalid duration"), "{p:?}");
    let p = Config::parse("[[listener]]\nlisten = \"nowhere\"\n").expect_err("bad");
    assert_eq!(p[0].line, Some(2), "{p:?}");
}

#[test]
fn a_type_error_hides_nothing_after_it() {
    let text = "[timeouts]\nheader = \"ten seconds\"\n\
                [[listener]]\nlisten = \"nowhere\"\n\
                [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:1080\"\nh2c = true\n\
                [[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:8000\"\n\
                target = \"127.0.0.1:1080\"\n\
                [limits]\nmax_connections = \"many\"\n";
    let p = Config::parse(text).expect_err("five faults");
    let lines: Vec<Option<usize>> = p.iter().map(|p| p.line).collect();
    // One problem each: the listener whose `listen` is no address is not reported again
    // as missing it, and the listeners after it keep their own lines.
    assert_eq!(lines, [Some(2), Some(4), Some(8), Some(12), Some(14)], "{p:?}");
    let wants = ["invalid duration", "nowhere", "h2c", "own listener", "expected a number"];
    for (problem, want) in p.iter().zip(wants) {
        assert!(problem.message.contains(want), "{want}: {p:?}");
    }
    // What could be read is there for the checks after parsing.
    let parsed = Config::parse_all(text);
    assert_eq!(parsed.config.listeners.len(), 2);
    assert_eq!(parsed.lines.of(&["listener", "0", "kind"]), Some(6));
    assert!(parsed.lines.damaged(&["timeouts", "header"]));
    assert!(!parsed.lines.damaged(&["listener", "0"]));
}

#[test]
fn a_type_error_names_its_key() {
    let table = [
        ("workers = \"two\"\n", "line 1: workers: expected a number, found \"two\""),
        (
            "\n[limits]\nmax_headers = -5\n",
            "line 3: limits.max_headers: expected a number, 0 or more, found -5",
        ),
        ("[http]\nvia = \"yes\"\n", "line 2: http.via: expected true or false, found \"yes\""),
        (
            "[[listener]]\nlisten = \"127.0.0.1:1\"\n[[listener]]\nlisten = 3128\n",
            "line 4: listener.1.listen: expected an address and port (\"127.0.0.1:3128\", \
             \"[::1]:3128\"), found 3128",
        ),
        (
            "[admin]\nallow = \"10.0.0.0/8\"\n",
            "line 2: admin.allow: expected a list, found \"10.0.0.0/8\"",
        ),
        ("[timeouts]\nio = -5\n", "line 2: timeouts.io: expected a duration"),
    ];
    for (text, want) in table {
        let p = Config::parse(text).expect_err(text);
        let shown = p[0].to_string();
        assert!(shown.starts_with(want), "{text:?}: {shown}");
    }
}

#[test]
fn proxy_protocol_needs_its_sources() {
    let text = "[[listener]]\nlisten = \"127.0.0.1:1\"\nproxy_protocol = \"v2\"\n\
                [[listener]]\nlisten = \"127.0.0.1:2\"\nproxy_protocol_from = [\"10.0.0.0/8\"]\n\
                [[listener]]\nkind = \"udp-relay\"\nlisten = \"127.0.0.1:3\"\ntarget = \"127.0.0.1:9\"\n\
                proxy_protocol = \"v1\"\nproxy_protocol_from = [\"10.0.0.1\"]\n";
    let p = Config::parse(text).expect_err("three faults");
    let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    let wants = [
        "line 3: listener.0.proxy_protocol: needs `proxy_protocol_from",
        "line 6: listener.1.proxy_protocol_from: is only read with `proxy_protocol",
        "line 11: listener.2.proxy_protocol: a udp-relay listener takes no",
    ];
    for want in wants {
        assert!(shown.iter().any(|s| s.starts_with(want)), "{want}: {shown:?}");
    }
    let bad = "[[listener]]\nlisten = \"127.0.0.1:1\"\nproxy_protocol = \"v3\"\n\
               proxy_protocol_from = [\"10.0.0.0/8\"]\n";
    assert!(Config::parse(bad).is_err());
    let bad = "[[listener]]\nlisten = \"127.0.0.1:1\"\nproxy_protocol = \"any\"\n\
               proxy_protocol_from = [\"10.1.0.0/8\"]\n";
    assert!(Config::parse(bad).is_err());
    let good = "[[listener]]\nlisten = \"127.0.0.1:1\"\nproxy_protocol = \"any\"\n\
                proxy_protocol_from = [\"10.0.0.0/8\", \"::1\"]\n";
    let c = Config::parse(good).expect("a valid proxy_protocol listener");
    assert_eq!(c.listeners[0].proxy_protocol, Some(ProxyProtocol::Any));
    assert_eq!(c.listeners[0].proxy_protocol_from.len(), 2);
}

#[test]
fn proxy_protocol_from_everywhere_needs_allow_open_proxy() {
    for all in ["0.0.0.0/0", "::/0"] {
        let text = format!(
            "[[listener]]\nlisten = \"127.0.0.1:1\"\nproxy_protocol = \"any\"\n\
             proxy_protocol_from = [\"10.0.0.1\", \"{all}\"]\n"
        );
        let p = Config::parse(&text).expect_err(all);
        let shown = p[0].to_string();
        assert!(
            shown.starts_with(&format!("line 4: listener.0.proxy_protocol_from: {all} lets any")),
            "{shown}"
        );
        assert!(shown.contains("allow_open_proxy"), "{shown}");
        Config::parse(&format!("allow_open_proxy = true\n{text}")).expect("opted in");
    }
    // A wide block that is not everything is the operator's call.
    let text = "[[listener]]\nlisten = \"127.0.0.1:1\"\nproxy_protocol = \"any\"\n\
                proxy_protocol_from = [\"10.0.0.0/8\", \"::/1\"]\n";
    Config::parse(text).expect("not /0");
}

#[test]
fn a_listener_problem_names_its_key() {
    let text = "[[listener]]\nlisten = \"127.0.0.1:1\"\nrate_up = \"10mb\"\n\
                [[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:2\"\nh2c = true\n\
                [[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:3\"\n";
    let p = Config::parse(text).expect_err("three faults");
    let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    let wants = [
        "line 3: listener.0.rate_up: rate \"10mb\"",
        "line 7: listener.1.h2c: h2c is for http and auto listeners, not socks",
        "line 9: listener.2: a relay listener needs `target",
    ];
    for want in wants {
        assert!(shown.iter().any(|s| s.starts_with(want)), "{want}: {shown:?}");
    }
}

#[test]
fn a_syntax_error_is_reported_with_its_line() {
    let p = Config::parse("workers = 1\n[limits\nmax_connections = 3\n").expect_err("bad");
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].line, Some(2), "{p:?}");
}

#[test]
fn public_listener_needs_explicit_consent() {
    let text = "[[listener]]\nlisten = \"0.0.0.0:3128\"\n";
    let p = Config::parse(text).expect_err("open proxy");
    assert_eq!(p[0].line, Some(2));
    assert!(p[0].message.contains("open proxy"));
    let ok = format!("allow_open_proxy = true\n{text}");
    assert!(Config::parse(&ok).is_ok());
}

#[test]
fn admin_section() {
    let text = "[admin]\nlisten = \"127.0.0.1:9090\"\nmax_user_series = 5\n";
    let c = Config::parse(text).expect("valid admin");
    assert_eq!(c.admin.listen, Some("127.0.0.1:9090".parse().expect("address")));
    assert_eq!(c.admin.max_user_series, 5);
    assert!(c.admin.token.is_none() && c.admin.allow.is_empty());
    assert_eq!(Config::parse("").expect("empty").admin.max_user_series, DEFAULT_MAX_USER_SERIES);
    // Reachable from other machines with no token and no client blocks: refused,
    // with the line of `listen`.
    let open = "workers = 1\n[admin]\nlisten = \"0.0.0.0:9090\"\n";
    let p = Config::parse(open).expect_err("open admin");
    assert_eq!(p[0].line, Some(3), "{p:?}");
    assert!(p[0].message.contains("admin listener on 0.0.0.0:9090"), "{p:?}");
    for protect in ["token = \"s3cret\"", "allow = [\"10.0.0.0/8\"]"] {
        assert!(Config::parse(&format!("{open}{protect}\n")).is_ok(), "{protect}");
    }
    // A bad block and an unknown key are reported with their lines.
    let p = Config::parse("[admin]\nport = 1\n").expect_err("unknown key");
    assert_eq!(p[0].to_string(), "line 2: unknown key `admin.port`");
    let p = Config::parse("[admin]\nallow = [\"10.1.0.0/8\"]\n").expect_err("bad block");
    assert_eq!(p[0].line, Some(2), "{p:?}");
    assert!(p[0].message.contains("host bits"), "{p:?}");
}

#[test]
fn the_example_file_is_valid() {
    let text = include_str!("../../../../rustle.example.toml");
    let c = Config::parse(text).expect("rustle.example.toml must stay valid");
    assert_eq!(c.listeners.len(), 1);
}

#[test]
fn the_example_documents_http2_with_its_defaults() {
    let text = include_str!("../../../../rustle.example.toml");
    let c = Config::parse(text).expect("valid");
    let d = Http2::default();
    let h = &c.http2;
    assert_eq!(
        (h.max_concurrent_streams, h.max_header_list_size, h.initial_stream_window),
        (d.max_concurrent_streams, d.max_header_list_size, d.initial_stream_window)
    );
    assert_eq!(
        (h.initial_connection_window, h.max_send_buffer_size, h.flood_window),
        (d.initial_connection_window, d.max_send_buffer_size, d.flood_window)
    );
    assert_eq!(
        (h.max_pending_accept_reset_streams, h.max_local_error_reset_streams),
        (d.max_pending_accept_reset_streams, d.max_local_error_reset_streams)
    );
    assert_eq!(
        (h.max_resets, h.max_pings, h.max_settings),
        (d.max_resets, d.max_pings, d.max_settings)
    );
    let table: toml::Table = text.parse().expect("toml");
    let keys = table["http2"].as_table().map_or(0, |t| t.len());
    assert_eq!(keys, 11, "every [http2] key is in the example");
    assert!(text.contains("\nh2c = false"));
}

#[test]
fn http2_values_are_checked() {
    let p = Config::parse("[http2]\ninitial_stream_window = 10\n").expect_err("bad");
    assert_eq!(p[0].line, Some(2), "{p:?}");
    assert!(p[0].message.contains("http2.initial_stream_window"), "{p:?}");
    let text = "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:1\"\nh2c = true\n";
    let p = Config::parse(text).expect_err("h2c on socks");
    assert_eq!(p[0].line, Some(4), "{p:?}");
}

#[test]
fn relay_listeners_need_a_target() {
    let text = "[[listener]]\nkind = \"relay\"\nlisten = \"127.0.0.1:1\"\n";
    let p = Config::parse(text).expect_err("no target");
    assert_eq!(p[0].line, Some(2), "{p:?}");
    let ok = format!("{text}target = \"[::1]:80\"\n");
    let c = Config::parse(&ok).expect("valid");
    assert_eq!(c.listeners[0].target.as_ref().map(|t| t.to_string()), Some("[::1]:80".into()));
    let text = "[[listener]]\nkind = \"socks\"\nlisten = \"127.0.0.1:1\"\ntarget = \"a:1\"\n";
    assert!(Config::parse(text).is_err());
    assert!("a:0".parse::<HostPort>().is_err());
    assert!("::1:80".parse::<HostPort>().is_err());
    assert_eq!("Example.COM:443".parse::<HostPort>().map(|h| h.host), Ok("example.com".into()));
}

#[test]
fn a_relay_takes_no_auth() {
    for kind in ["relay", "udp-relay"] {
        let text = format!(
            "[[listener]]\nkind = \"{kind}\"\nlisten = \"127.0.0.1:1\"\n\
             target = \"127.0.0.1:2\"\nauth = true\n"
        );
        let p = Config::parse(&text).expect_err("auth on a relay");
        assert!(p[0].message.contains("takes no `auth`"), "{p:?}");
    }
}

#[test]
fn a_relay_to_an_own_listener_is_refused() {
    // (listeners before the relay, the relay's kind, its target, a loop?)
    let table: &[(&str, &str, &str, bool)] = &[
        ("", "relay", "127.0.0.1:8000", true),
        ("", "relay", "localhost:8000", true),
        ("", "relay", "[::ffff:127.0.0.1]:8000", true),
        ("", "relay", "0.0.0.0:8000", true),
        ("", "relay", "127.0.0.1:8001", false),
        ("", "relay", "127.0.0.2:8000", false),
        ("", "relay", "example.com:8000", false),
        ("", "udp-relay", "127.0.0.1:8000", true),
        // Another listener of the proxy, on the same transport.
        ("listen = \"0.0.0.0:3128\"", "relay", "127.0.0.5:3128", true),
        ("listen = \"127.0.0.1:3128\"", "relay", "localhost:3128", true),
        ("listen = \"[::1]:3128\"", "relay", "localhost:3128", true),
        ("listen = \"127.0.0.1:3128\"", "udp-relay", "127.0.0.1:3128", false),
        (
            "kind = \"udp-relay\"\nlisten = \"127.0.0.1:53\"\ntarget = \"192.0.2.1:53\"",
            "relay",
            "127.0.0.1:53",
            false,
        ),
        (
            "kind = \"udp-relay\"\nlisten = \"127.0.0.1:53\"\ntarget = \"192.0.2.1:53\"",
            "udp-relay",
            "127.0.0.1:53",
            true,
        ),
        // Port 0 is chosen at start: never a loop here (the built-in check refuses it then).
        ("listen = \"127.0.0.1:0\"", "relay", "127.0.0.1:9", false),
    ];
    for (other, kind, target, want) in table {
        // (Open-proxy consent for the 0.0.0.0 listener.)
        let mut text = "allow_open_proxy = true\n".to_string();
        if !other.is_empty() {
            text.push_str(&format!("[[listener]]\n{other}\n"));
        }
        let target_line = text.lines().count() + 4;
        text.push_str(&format!(
            "[[listener]]\nkind = \"{kind}\"\nlisten = \"127.0.0.1:8000\"\n\
             target = \"{target}\"\n"
        ));
        match (Config::parse(&text), want) {
            (Ok(_), false) => {}
            (Err(p), true) => {
                assert_eq!(p.len(), 1, "{text}\n{p:?}");
                assert_eq!(p[0].line, Some(target_line), "{text}\n{p:?}");
                assert!(p[0].message.contains("own listener"), "{text}\n{p:?}");
            }
            (got, _) => panic!("{text}\n{got:?}"),
        }
    }
    // Listeners given on the command line are checked at start the same way.
    let mut c = Config::default();
    let mut relay = Listener::new(ListenerKind::Relay, "127.0.0.1:8000".parse().expect("addr"));
    relay.target = Some("127.0.0.1:8000".parse().expect("target"));
    c.listeners.push(relay);
    assert!(c.check_listeners().expect_err("loop").contains("own listener"));
}

#[test]
fn durations_in_the_file() {
    // (Their spellings: `config/duration`.)
    let c =
        Config::parse("[timeouts]\nheader = \"1h 30m\"\nio = 5\nconnect = \"5\"\n").expect("valid");
    assert_eq!(c.timeouts.header, Duration::from_secs(5400));
    assert_eq!(
        (c.timeouts.io, c.timeouts.connect),
        (Duration::from_secs(5), Duration::from_secs(5))
    );
    // "Forever" as a huge number is refused, not overflowed.
    let e = Config::parse("[timeouts]\ntunnel_idle = 9223372036854775807\n").expect_err("huge");
    assert!(format!("{e:?}").contains("too long"), "{e:?}");
}

#[test]
fn rules_and_routes_read_the_same_conditions_and_report_unknown_keys() {
    let text = "[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"127.0.0.1:3128\"\n\
                [[rule]]\naction = \"allow\"\nhosts = [\"a.example\"]\nports = [\"443\"]\n\
                [[route]]\nhosts = [\"a.example\"]\nports = [\"443\"]\nvia = \"p\"\n";
    let c = Config::parse(text).expect("valid");
    let (rule, route) = (&c.rules[0].conditions, &c.routes[0].conditions);
    assert_eq!(rule.hosts, route.hosts);
    assert_eq!(rule.ports, route.ports);
    assert_eq!(c.routes[0].via, ["p"]);
    // A typo in either table is an unknown key, with its line; a value of the wrong type
    // is named by its key.
    let text = "[[rule]]\naction = \"allow\"\nhost = [\"a.example\"]\n\
                [[route]]\nvia = \"direct\"\nport = [\"443\"]\n\
                [[route]]\nvia = \"direct\"\nclients = \"10.0.0.0/8\"\n";
    let p = Config::parse(text).expect_err("typos");
    let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert!(shown.contains(&"line 3: unknown key `rule.0.host`".to_string()), "{shown:?}");
    assert!(shown.contains(&"line 6: unknown key `route.0.port`".to_string()), "{shown:?}");
    let want = "line 9: route.1.clients: expected a list, found \"10.0.0.0/8\"";
    assert!(shown.contains(&want.to_string()), "{shown:?}");
    // Required keys stay required.
    let p = Config::parse("[[rule]]\nhosts = [\"a\"]\n[[route]]\nhosts = [\"b\"]\n")
        .expect_err("missing keys");
    let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert!(shown.iter().any(|s| s.contains("missing field `action`")), "{shown:?}");
    assert!(shown.iter().any(|s| s.contains("missing field `via`")), "{shown:?}");
}

#[test]
fn the_dns_section() {
    let c = Config::parse(
        "[dns]\nservers = [\"127.0.0.1:5353\", \"9.9.9.9\", \"[::1]:53\"]\nprefer = \"ipv6\"\n\
         ttl_min = \"1s\"\nttl_max = \"1h\"\n[dns.hosts]\n\"a.example\" = [\"192.0.2.1\", \"2001:db8::1\"]\n",
    )
    .expect("valid");
    assert_eq!(
        c.dns.server_addrs(),
        ["127.0.0.1:5353", "9.9.9.9:53", "[::1]:53"]
            .map(|s| s.parse::<std::net::SocketAddr>().expect("addr"))
    );
    assert_eq!(c.dns.prefer, crate::config::Prefer::Ipv6);
    assert_eq!(c.dns.hosts["a.example"].len(), 2);
    assert_eq!(c.dns.ttl_max, Duration::from_secs(3600));
    let example = Config::parse(include_str!("../../../../rustle.example.toml")).expect("valid");
    assert_eq!(example.dns, crate::config::Dns::default(), "the example shows the defaults");

    let text = "[dns]\nservers = [\"dns.example\"]\nattempts = 0\nttl_min = \"2h\"\n\
                prefer = \"ipv5\"\n[dns.hosts]\n\"192.0.2.1\" = [\"192.0.2.2\"]\n\"empty.example\" = []\n";
    let e = format!("{:?}", Config::parse(text).expect_err("bad"));
    for want in [
        "Some(2)",
        "dns.servers",
        "not an address",
        "Some(3)",
        "dns.attempts",
        "prefer",
        "not a host name",
        "has no address",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
    let text = "[dns]\nttl_min = \"2h\"\n";
    let e = format!("{:?}", Config::parse(text).expect_err("bad"));
    assert!(e.contains("Some(2)") && e.contains("ttl_min"), "{e}");
}

#[test]
fn dns_servers_over_tls_and_https() {
    use crate::config::{NameServer, Transport};
    let c = Config::parse(
        "[dns]\nservers = [\"tls://198.18.0.53#dns.example\", \"tls://[2001:db8::53]:8853#dns.example\", \
         \"https://198.18.0.54/q#doh.example\", \"https://198.18.0.55:8443#doh.example\"]\n\
         ca = \"/etc/rustle/dns-ca.pem\"\n",
    )
    .expect("valid");
    let addr = |s: &str| s.parse::<std::net::SocketAddr>().expect("addr");
    let tls = || Transport::Tls { name: "dns.example".into() };
    let https = |path: &str| Transport::Https { name: "doh.example".into(), path: path.into() };
    assert_eq!(
        c.dns.name_servers(),
        [
            NameServer { addr: addr("198.18.0.53:853"), transport: tls() },
            NameServer { addr: addr("[2001:db8::53]:8853"), transport: tls() },
            NameServer { addr: addr("198.18.0.54:443"), transport: https("/q") },
            NameServer { addr: addr("198.18.0.55:8443"), transport: https("/dns-query") },
        ]
    );
    assert!(c.dns.encrypted());
    let text = "[dns]\nservers = [\"tls://198.18.0.53\", \"quic://198.18.0.53#x.example\", \
                \"https://dns.example#dns.example\", \"tls://198.18.0.53#not a name\"]\n";
    let e = format!("{:?}", Config::parse(text).expect_err("bad"));
    for want in
        ["names no server name", "unknown scheme `quic`", "not an address", "not a server name"]
    {
        assert!(e.contains(want), "{want}: {e}");
    }
    let e = format!("{:?}", Config::parse("[dns]\nca = \"/x.pem\"\n").expect_err("no tls server"));
    assert!(e.contains("dns.ca") && e.contains("no tls:// or https:// server"), "{e}");
}

#[test]
fn upstream_dns_cache_ttl_is_refused_naming_the_dns_keys() {
    let e = format!(
        "{:?}",
        Config::parse("[upstream]\npool_max_idle = 10\ndns_cache_ttl = \"30s\"\n")
            .expect_err("refused")
    );
    assert!(e.contains("Some(3)") && e.contains("upstream.dns_cache_ttl is not a setting"), "{e}");
    assert!(e.contains("[dns] ttl_min and ttl_max"), "{e}");
    assert!(!e.contains("unknown key"), "said once, with what to use: {e}");
}
