use super::super::{Config, Problem};
use super::*;

/// The problems of `text`, which must fail.
fn problems(text: &str) -> Vec<Problem> {
    Config::parse(text).expect_err(text)
}

const CORP: &str = "[[parent]]\nname = \"corp\"\nkind = \"http\"\naddress = \"10.0.0.1:3128\"\n";
const EXIT: &str = "[[parent]]\nname = \"exit\"\nkind = \"socks5\"\naddress = \"10.0.0.2:1080\"\n";

#[test]
fn the_schema_parses_with_its_defaults() {
    let text = format!(
        "{CORP}{EXIT}user = \"alice\"\npassword = \"s3cret\"\nweight = 3\nmax_failures = 5\n\
         down_for = \"1m\"\nprobe = \"connect example.com:443\"\nprobe_every = 2\n\
         [[parent]]\nname = \"tls\"\nkind = \"https\"\naddress = \"[::1]:3129\"\nca = \"ca.pem\"\n\
         server_name = \"proxy.corp\"\npass_user = true\nprobe = \"tcp\"\n\
         [[parent]]\nname = \"old\"\nkind = \"socks4a\"\naddress = \"Proxy.Example:1080\"\nuser = \"id\"\n\
         [[group]]\nname = \"exits\"\nparents = [\"exit\", \"old\"]\nsticky = \"user\"\nfallback = \"direct\"\n\
         [[group]]\nname = \"plain\"\nparents = [\"corp\"]\n\
         [[route]]\nname = \"intranet\"\nhosts = [\"*.corp.example\"]\nvia = \"corp\"\n\
         [[route]]\nusers = [\"bob\"]\nports = [\"443\"]\nvia = [\"corp\", \"exits\"]\n\
         [[route]]\nvia = \"direct\"\n"
    );
    let c = Config::parse(&text).unwrap_or_else(|p| panic!("{p:?}"));
    assert_eq!(c.parents.len(), 4);
    let corp = &c.parents[0];
    assert_eq!((corp.kind, corp.address.to_string()), (ParentKind::Http, "10.0.0.1:3128".into()));
    assert_eq!((corp.weight, corp.max_failures), (1, 3));
    assert_eq!(
        (corp.down_for, corp.probe_every),
        (Duration::from_secs(30), Duration::from_secs(10))
    );
    assert_eq!((corp.probe.as_ref(), corp.user.as_ref(), corp.pass_user), (None, None, false));
    let exit = &c.parents[1];
    assert_eq!(exit.user.as_deref(), Some("alice"));
    assert_eq!(exit.password.as_ref().map(Secret::expose), Some("s3cret"));
    assert_eq!((exit.weight, exit.max_failures), (3, 5));
    assert_eq!(
        (exit.down_for, exit.probe_every),
        (Duration::from_secs(60), Duration::from_secs(2))
    );
    assert_eq!(exit.probe, Some(Probe::Connect("example.com:443".parse().expect("target"))));
    let tls = &c.parents[2];
    assert_eq!((tls.kind, tls.address.host.as_str()), (ParentKind::Https, "::1"));
    assert_eq!(tls.server_name.as_deref(), Some("proxy.corp"));
    assert_eq!((tls.pass_user, tls.probe.clone()), (true, Some(Probe::Tcp)));
    assert_eq!(c.parents[3].address.host, "proxy.example");
    assert_eq!(c.groups[0].sticky, Sticky::User);
    assert_eq!(c.groups[0].fallback, "direct");
    assert_eq!((c.groups[1].sticky, c.groups[1].fallback.as_str()), (Sticky::None, "deny"));
    let vias: Vec<&[String]> = c.routes.iter().map(|r| r.via.as_slice()).collect();
    assert_eq!(
        vias,
        [&["corp".to_string()][..], &["corp".into(), "exits".into()], &["direct".into()]]
    );
    assert_eq!(c.routes[0].label(0), "route `intranet`");
    assert_eq!(c.routes[2].label(2), "route 3");
}

/// Every check, with the line it names: (text, line, part of the message).
#[test]
fn every_check_names_its_line() {
    let parent = |extra: &str| format!("{CORP}{extra}");
    let table: Vec<(String, usize, &str)> = vec![
        // Names.
        (format!("{CORP}{CORP}"), 6, "the name `corp` is already taken by parent 1"),
        (format!("{CORP}[[group]]\nname = \"corp\"\nparents = [\"corp\"]\n"), 6, "already taken"),
        ("[[parent]]\nname = \"direct\"\nkind = \"http\"\naddress = \"a:1\"\n".into(), 2, "reserved"),
        (format!("{CORP}[[group]]\nname = \"deny\"\nparents = [\"corp\"]\n"), 6, "reserved"),
        ("[[parent]]\nname = \"\"\nkind = \"http\"\naddress = \"a:1\"\n".into(), 2, "an empty name"),
        // Kind-specific keys.
        (parent("ca = \"ca.pem\"\n"), 5, "`ca` is for https parents, not http"),
        (parent("server_name = \"x\"\n"), 5, "`server_name` is for https parents"),
        (parent("proxy_protocol = \"any\"\n"), 5, "sends one version"),
        (
            "[[parent]]\nname = \"t\"\nkind = \"https\"\naddress = \"a:1\"\nserver_name = \"a b\"\n".into(),
            5,
            "`a b` is not a server name",
        ),
        (
            "[[parent]]\nname = \"s\"\nkind = \"socks4a\"\naddress = \"a:1\"\nuser = \"u\"\npassword = \"p\"\n"
                .into(),
            6,
            "socks4a carries no password",
        ),
        (parent("password = \"p\"\n"), 5, "a password needs `user`"),
        (parent("user = \"a:b\"\npassword = \"p\"\n"), 5, "cannot hold `:`"),
        (parent("user = \"\"\n"), 5, "an empty user name"),
        (
            format!(
                "[[parent]]\nname = \"s\"\nkind = \"socks5\"\naddress = \"a:1\"\nuser = \"u\"\n\
                 password = \"{}\"\n",
                "x".repeat(256)
            ),
            6,
            "at most 255 bytes",
        ),
        // Numbers.
        (parent("weight = 0\n"), 5, "weight 0"),
        (parent("down_for = 0\n"), 5, "down_for"),
        (parent("probe_every = \"0s\"\n"), 5, "probe_every"),
        // Groups.
        ("[[group]]\nname = \"g\"\nparents = []\n".into(), 3, "at least one parent"),
        (format!("{CORP}[[group]]\nname = \"g\"\nparents = [\"corp\", \"nope\"]\n"), 7, "names no parent `nope`"),
        (format!("{CORP}[[group]]\nname = \"g\"\nparents = [\"corp\", \"corp\"]\n"), 7, "lists `corp` twice"),
        (
            format!("{CORP}[[group]]\nname = \"g\"\nparents = [\"corp\"]\n[[group]]\nname = \"h\"\nparents = [\"g\"]\n"),
            10,
            "`g` is a group",
        ),
        (
            format!("{CORP}[[group]]\nname = \"g\"\nparents = [\"corp\"]\nfallback = \"elsewhere\"\n"),
            8,
            "fallback `elsewhere` is no parent or group",
        ),
        (
            format!(
                "{CORP}{EXIT}[[group]]\nname = \"a\"\nparents = [\"corp\"]\nfallback = \"b\"\n\
                 [[group]]\nname = \"b\"\nparents = [\"exit\"]\nfallback = \"a\"\n"
            ),
            12,
            "the fallbacks loop: a → b → a",
        ),
        (
            format!("{CORP}[[group]]\nname = \"a\"\nparents = [\"corp\"]\nfallback = \"a\"\n"),
            8,
            "the fallbacks loop: a → a",
        ),
        // Routes.
        ("[[route]]\nvia = \"nowhere\"\n".into(), 2, "route 1: names no parent or group `nowhere`"),
        (format!("{CORP}[[route]]\nname = \"r\"\nvia = [\"corp\", \"gone\"]\n"), 7, "route `r`: names no parent or group `gone`"),
        ("[[route]]\nvia = []\n".into(), 2, "goes nowhere"),
        (format!("{CORP}[[route]]\nvia = [\"corp\", \"direct\"]\n"), 6, "`direct` stands alone"),
        (format!("{CORP}[[route]]\nvia = [\"corp\", \"corp\"]\n"), 6, "goes through `corp` twice"),
        (
            format!(
                "{CORP}{EXIT}[[group]]\nname = \"a\"\nparents = [\"corp\", \"exit\"]\n\
                 [[group]]\nname = \"b\"\nparents = [\"exit\"]\n[[route]]\nvia = [\"a\", \"b\"]\n"
            ),
            16,
            "may go through parent `exit` twice (hops `a` and `b`)",
        ),
        (
            // Through a fallback.
            format!(
                "{CORP}{EXIT}[[group]]\nname = \"a\"\nparents = [\"exit\"]\nfallback = \"corp\"\n\
                 [[route]]\nvia = [\"corp\", \"a\"]\n"
            ),
            14,
            "may go through parent `corp` twice",
        ),
        ("[[route]]\nports = [\"0\"]\nvia = \"direct\"\n".into(), 1, "route 1: `ports`"),
        ("[[route]]\nname = \"r\"\nhosts = []\nvia = \"deny\"\n".into(), 1, "route `r`: `hosts = []`"),
        // A parent that is one of the proxy's own listeners.
        (
            format!("[[listener]]\nlisten = \"127.0.0.1:3128\"\n{}", CORP.replace("10.0.0.1", "127.0.0.1")),
            6,
            "is this proxy's own listener 127.0.0.1:3128 (http)",
        ),
        (
            "allow_open_proxy = true\n[[listener]]\nlisten = \"0.0.0.0:8080\"\n\
             [[parent]]\nname = \"me\"\nkind = \"socks5\"\naddress = \"localhost:8080\"\n"
                .into(),
            7,
            "own listener 0.0.0.0:8080",
        ),
    ];
    for (text, line, message) in &table {
        let p = problems(text);
        assert_eq!(p.len(), 1, "{text}\n{p:#?}");
        assert_eq!(p[0].line, Some(*line), "{text}\n{p:#?}");
        assert!(p[0].message.contains(message), "{text}\n{p:#?}");
    }
}

#[test]
fn what_is_not_a_loop() {
    let ok = [
        // Another port, another address, a UDP listener on the parent's port.
        format!("[[listener]]\nlisten = \"127.0.0.1:3127\"\n{}", CORP.replace("10.0.0.1", "127.0.0.1")),
        format!("[[listener]]\nlisten = \"127.0.0.2:3128\"\n{}", CORP.replace("10.0.0.1", "127.0.0.1")),
        format!(
            "[[listener]]\nkind = \"udp-relay\"\nlisten = \"127.0.0.1:3128\"\ntarget = \"192.0.2.1:53\"\n{}",
            CORP.replace("10.0.0.1", "127.0.0.1")
        ),
        // Two chains sharing a parent, and a chain of distinct groups.
        format!(
            "{CORP}{EXIT}[[group]]\nname = \"a\"\nparents = [\"exit\"]\n\
             [[route]]\nvia = [\"corp\", \"a\"]\n[[route]]\nvia = [\"corp\", \"exit\"]\n"
        ),
        // A fallback chain that ends.
        format!(
            "{CORP}{EXIT}[[group]]\nname = \"a\"\nparents = [\"corp\"]\nfallback = \"b\"\n\
             [[group]]\nname = \"b\"\nparents = [\"exit\"]\nfallback = \"direct\"\n"
        ),
    ];
    for text in &ok {
        if let Err(p) = Config::parse(text) {
            panic!("{text}\n{p:#?}");
        }
    }
}

#[test]
fn bad_values_are_reported_with_their_lines() {
    // (text, line, part of the message)
    let table: &[(&str, usize, &str)] = &[
        ("[[parent]]\nname = \"p\"\nkind = \"gopher\"\naddress = \"a:1\"\n", 3, "unknown variant `gopher`"),
        ("[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"nowhere\"\n", 4, "not host:port"),
        ("[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"a:0\"\n", 4, "port 0"),
        ("[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"a:1\"\nprobe = \"ping\"\n", 5, "probe `ping`"),
        (
            "[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"a:1\"\nprobe = \"connect nowhere\"\n",
            5,
            "not host:port",
        ),
        ("[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"a:1\"\ndown_for = \"soon\"\n", 5, "invalid duration"),
        ("[[parent]]\nname = \"p\"\nkind = \"http\"\naddress = \"a:1\"\nweight = -1\n", 5, ""),
        ("[[group]]\nname = \"g\"\nparents = [\"a\"]\nsticky = \"ip\"\n", 4, "unknown variant `ip`"),
        ("[[route]]\nvia = 3\n", 2, "a name or a list of names"),
        ("[[route]]\nvia = [\"a\", 3]\n", 2, ""),
        ("[[route]]\nhosts = [\"a\"]\n", 1, "missing field `via`"),
    ];
    for (text, line, message) in table {
        let p = problems(text);
        assert_eq!(p[0].line, Some(*line), "{text}\n{p:#?}");
        assert!(p[0].message.contains(message), "{text}\n{p:#?}");
    }
}

#[test]
fn unknown_keys_are_reported_with_their_lines() {
    let text = format!(
        "{CORP}passwd = \"x\"\n[[group]]\nname = \"g\"\nparents = [\"corp\"]\nweights = [1]\n\
         [[route]]\nvia = \"g\"\naction = \"deny\"\n"
    );
    let shown: Vec<String> = problems(&text).iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "line 5: unknown key `parent.0.passwd`",
            "line 9: unknown key `group.0.weights`",
            "line 12: unknown key `route.0.action`",
        ],
        "{text}"
    );
}

#[test]
fn passwords_appear_in_no_message_nor_debug_output() {
    let text = "[[parent]]\nname = \"s\"\nkind = \"socks4a\"\naddress = \"a:1\"\nuser = \"u\"\n\
                password = \"hunter2\"\n[[parent]]\nname = \"h\"\nkind = \"http\"\naddress = \"b:1\"\n\
                password = \"hunter2\"\nweight = 0\n";
    let p = problems(text);
    assert!(p.len() >= 3, "{p:#?}");
    for problem in &p {
        assert!(!problem.to_string().contains("hunter2"), "{problem}");
    }
    let ok = "[[parent]]\nname = \"h\"\nkind = \"http\"\naddress = \"b:1\"\nuser = \"u\"\n\
              password = \"hunter2\"\n";
    let c = Config::parse(ok).expect("valid");
    let shown = format!("{c:?} {:?} {:#?}", c.parents[0], c.parents[0].password);
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("***"), "{shown}");
}

#[test]
fn command_line_listeners_are_checked_against_parents() {
    let local = CORP.replace("10.0.0.1:3128", "127.0.0.1:8000");
    let mut c = Config::parse(&local).expect("valid");
    assert!(c.check_listeners().is_ok());
    let listen = "127.0.0.1:8000".parse().expect("addr");
    c.listeners.push(super::super::Listener::new(super::super::ListenerKind::Auto, listen));
    let e = c.check_listeners().expect_err("loop");
    assert!(e.contains("parent `corp`") && e.contains("own listener"), "{e}");
    // The default listeners (127.0.0.1:1080 among them) count when there are none.
    let mut c = Config::parse(&CORP.replace("10.0.0.1:3128", "localhost:1080")).expect("valid");
    assert!(c.check_listeners().expect_err("loop").contains("127.0.0.1:1080 (socks)"));
    c.listeners.push(super::super::Listener::new(super::super::ListenerKind::Auto, listen));
    assert!(c.check_listeners().is_ok());
}

#[test]
fn routing_problems_for_configurations_built_in_code() {
    let mut c = Config::parse(CORP).expect("valid");
    assert!(c.routing_problems().is_empty());
    c.parents[0].weight = 0;
    c.groups.push(GroupConfig {
        name: "g".into(),
        parents: vec!["nope".into()],
        sticky: Sticky::None,
        fallback: DENY.into(),
    });
    let p = c.routing_problems();
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[0].starts_with("parent `corp`: weight 0"), "{p:?}");
    assert!(p[1].starts_with("group `g`: names no parent `nope`"), "{p:?}");
}

/// The commented-out tables of rustle.example.toml, uncommented, form a valid file with
/// one parent of each kind, a group and a chain.
#[test]
fn the_example_documents_parents_groups_and_routes() {
    let text = include_str!("../../../../../rustle.example.toml");
    let start = text.find("\n# [[parent]]").expect("a [[parent]] example");
    // The commented-out TOML lines (tables and `key = value`), without the prose.
    let is_toml = |l: &&str| {
        l.starts_with("[[")
            || l.split_once(" = ").is_some_and(|(key, _)| {
                !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            })
    };
    let uncommented: String = text[start..]
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(is_toml)
        .map(|l| format!("{l}\n"))
        .collect();
    let c = Config::parse(&uncommented).unwrap_or_else(|p| panic!("{p:#?}\n{uncommented}"));
    let kinds: Vec<ParentKind> = c.parents.iter().map(|p| p.kind).collect();
    for kind in [ParentKind::Http, ParentKind::Https, ParentKind::Socks5, ParentKind::Socks4a] {
        assert!(kinds.contains(&kind), "an example of {kind}: {kinds:?}");
    }
    assert!(c.parents.iter().any(|p| p.kind == ParentKind::Https && p.ca.is_some()));
    assert!(c.parents.iter().any(|p| p.kind == ParentKind::Socks5 && p.password.is_some()));
    assert!(c.groups.iter().any(|g| g.sticky != Sticky::None));
    assert!(c.groups.iter().any(|g| {
        let weights: Vec<u32> = g
            .parents
            .iter()
            .filter_map(|m| c.parents.iter().find(|p| p.name == *m))
            .map(|p| p.weight)
            .collect();
        weights.iter().any(|&w| w != weights[0])
    }));
    assert!(c.routes.iter().any(|r| r.via.len() > 1), "a chain");
}

#[test]
fn user_name_parameters_and_sticky_routes() {
    let declared = "[auth.params]\nseparator = \"-\"\nmax_ttl = \"2h\"\n\
                    [[auth.params.choice]]\nname = \"country\"\nvalues = [\"de\", \"us\"]\n";
    let ok = format!(
        "{declared}[[parent]]\nname = \"de1\"\nkind = \"http\"\naddress = \"10.0.0.1:3128\"\n\
         [[group]]\nname = \"de\"\nparents = [\"de1\"]\n\
         [[route]]\nparams = [\"country=de\"]\nvia = \"de\"\nsticky = \"session\"\nsticky_ttl = \"1m\"\n\
         [[rule]]\naction = \"allow\"\nparams = [\"country=us\"]\n"
    );
    let c = Config::parse(&ok).unwrap_or_else(|p| panic!("{p:#?}"));
    assert_eq!(c.routes[0].sticky, Some(StickyBy::Session));
    assert_eq!(c.routes[0].sticky_ttl, Some(Duration::from_secs(60)));
    let p = c.auth.params.as_ref().expect("declared");
    assert_eq!((p.separator.as_str(), p.max_ttl), ("-", Duration::from_secs(7200)));
    // (text, line, part of the message)
    let table: &[(String, usize, &str)] = &[
        ("[auth.params]\nseparator = \"x\"\n".into(), 2, "separator: 1 to 4 characters"),
        ("[auth.params]\nseparator = \"\"\n".into(), 2, "separator"),
        ("[auth.params]\nseperator = \"-\"\n".into(), 2, "seperator"),
        ("[auth.params]\nmax_ttl = \"soon\"\n".into(), 2, "invalid duration"),
        ("[auth.params]\nseparator = \":\"\n".into(), 2, "separator"),
        (
            "[auth.params]\n[[auth.params.choice]]\nname = \"session\"\nvalues = [\"a\"]\n".into(),
            2,
            "built in",
        ),
        (
            "[auth.params]\n[[auth.params.choice]]\nname = \"c\"\nvalues = [\"a-b\"]\n".into(),
            2,
            "without the separator",
        ),
        (
            "[auth.params]\nseparator = \"-+\"\n[[auth.params.choice]]\nname = \"c\"\nvalues = [\"a-\"]\n"
                .into(),
            3,
            "without the separator (or any of its characters)",
        ),
        (
            "[auth.params]\n[[auth.params.choice]]\nname = \"c d\"\nvalues = [\"a\"]\n".into(),
            2,
            "a name is 1 to 32",
        ),
        (
            "[[rule]]\naction = \"allow\"\nparams = [\"country=de\"]\n".into(),
            3,
            "needs [auth.params]",
        ),
        (
            format!("{declared}[[route]]\nvia = \"direct\"\nparams = [\"country=fr\"]\n"),
            9,
            "not a declared value",
        ),
        (
            format!("{declared}[[route]]\nvia = \"direct\"\nparams = [\"colour=red\"]\n"),
            9,
            "no parameter `colour`",
        ),
        (
            "[[route]]\nvia = \"direct\"\nsticky = \"client\"\n".into(),
            3,
            "unknown variant `client`",
        ),
        ("[[route]]\nvia = \"direct\"\nsticky_ttl = \"1m\"\n".into(), 3, "needs `sticky"),
        (
            "[[route]]\nvia = \"direct\"\nsticky = \"user\"\nsticky_ttl = \"0s\"\n".into(),
            4,
            "must not be zero",
        ),
        ("[[route]]\nvia = \"deny\"\nsticky = \"user\"\n".into(), 3, "nothing to stick to"),
    ];
    for (text, line, message) in table {
        let p = problems(text);
        assert_eq!(p[0].line, Some(*line), "{text}\n{p:#?}");
        assert!(p[0].message.contains(message), "{text}\n{p:#?}");
    }
}
