use super::*;
use crate::acl::Protocol;

fn routes(text: &str) -> Routes {
    let cfg = Config::parse(text).unwrap_or_else(|p| panic!("{p:#?}\n{text}"));
    Routes::build(&cfg, &[]).unwrap_or_else(|p| panic!("{p:#?}\n{text}"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

/// `name` as an http parent on 10.0.0.N:3128 with `extra` keys.
fn parent(name: &str, n: u8, extra: &str) -> String {
    format!(
        "[[parent]]\nname = \"{name}\"\nkind = \"http\"\naddress = \"10.0.0.{n}:3128\"\n{extra}\n"
    )
}

/// An anonymous CONNECT to example.com:443 from 192.0.2.1 on listener "main",
/// resolved to 203.0.113.5.
fn req() -> Request<'static> {
    Request {
        listener: Some("main"),
        client: ip("192.0.2.1"),
        user: None,
        groups: &[],
        host: "example.com",
        port: 443,
        protocol: Protocol::Connect,
        dest: Some(ip("203.0.113.5")),
        params: None,
    }
}

const fn assert_send_sync<T: Send + Sync>() {}
const _: () = assert_send_sync::<Routes>();
const _: () = assert_send_sync::<Parent>();

#[test]
fn no_route_is_direct() {
    let r = routes("");
    assert!(r.is_empty());
    assert_eq!(r.choose(&req()), Choice::Direct { route: None, egress: None });
    assert_eq!(
        r.choose(&Request { dest: None, ..req() }),
        Choice::Direct { route: None, egress: None }
    );
    let r = routes(&parent("corp", 1, ""));
    assert!(r.is_empty() && r.parents().len() == 1);
}

/// Each condition alone, matching and not: a route to `deny` with the condition, then
/// nothing.
#[test]
fn choose_on_each_condition() {
    let groups = ["staff".to_string()];
    let alice = Request { user: Some("alice"), groups: &groups, ..req() };
    let table: &[(&str, Request<'_>, bool)] = &[
        ("listeners = [\"main\"]", req(), true),
        ("listeners = [\"other\"]", req(), false),
        ("listeners = [\"main\"]", Request { listener: None, ..req() }, false),
        ("clients = [\"192.0.2.0/24\"]", req(), true),
        ("clients = [\"10.0.0.0/8\"]", req(), false),
        ("clients = [\"192.0.2.0/24\"]", Request { client: ip("::ffff:192.0.2.9"), ..req() }, true),
        ("users = [\"alice\"]", alice, true),
        ("users = [\"bob\"]", alice, false),
        ("users = [\"*\"]", alice, true),
        ("users = [\"*\"]", req(), false),
        ("groups = [\"staff\"]", alice, true),
        ("groups = [\"admins\"]", alice, false),
        ("hosts = [\"example.com\"]", req(), true),
        ("hosts = [\"example.com\"]", Request { host: "EXAMPLE.com.", ..req() }, true),
        ("hosts = [\"example.org\"]", req(), false),
        ("hosts = [\"*.example.com\"]", req(), false),
        ("hosts = [\"*.example.com\"]", Request { host: "www.Example.com", ..req() }, true),
        ("hosts = [\"*.example.com\"]", Request { host: "badexample.com", ..req() }, false),
        ("destinations = [\"203.0.113.0/24\"]", req(), true),
        ("destinations = [\"198.51.100.0/24\"]", req(), false),
        ("ports = [\"443\"]", req(), true),
        ("ports = [\"80\", \"8000-8999\"]", req(), false),
        ("ports = [\"400-500\"]", req(), true),
        ("protocols = [\"connect\"]", req(), true),
        ("protocols = [\"http\", \"socks5\"]", req(), false),
        ("protocols = [\"udp\"]", Request { protocol: Protocol::Udp, ..req() }, true),
    ];
    for (condition, r, matches) in table {
        let text = format!("[[route]]\nname = \"only\"\n{condition}\nvia = \"deny\"\n");
        let want = if *matches {
            Choice::Deny { route: "only" }
        } else {
            Choice::Direct { route: None, egress: None }
        };
        assert_eq!(routes(&text).choose(r), want, "{condition} for {r:?}");
    }
}

#[test]
fn destinations_need_the_address_as_rules_do() {
    let text = format!(
        "{}[[route]]\nname = \"inside\"\ndestinations = [\"10.0.0.0/8\"]\nvia = \"direct\"\n\
         [[route]]\nname = \"rest\"\nvia = \"corp\"\n",
        parent("corp", 1, "")
    );
    let r = routes(&text);
    let unresolved = Request { dest: None, ..req() };
    assert_eq!(r.choose(&unresolved), Choice::NeedAddress);
    let inside = Request { dest: Some(ip("10.1.2.3")), ..req() };
    assert_eq!(r.choose(&inside), Choice::Direct { route: Some("inside"), egress: None });
    assert_eq!(
        r.choose(&req()),
        Choice::Path { route: "rest", hops: &[Hop::Parent(0)], egress: None }
    );
    // A destination route whose other conditions do not match needs no address.
    let text = format!(
        "{}[[route]]\nports = [\"22\"]\ndestinations = [\"10.0.0.0/8\"]\nvia = \"deny\"\n\
         [[route]]\nvia = \"corp\"\n",
        parent("corp", 1, "")
    );
    let r = routes(&text);
    assert_eq!(
        r.choose(&unresolved),
        Choice::Path { route: "route 2", hops: &[Hop::Parent(0)], egress: None }
    );
    assert_eq!(r.choose(&Request { port: 22, ..unresolved }), Choice::NeedAddress);
}

#[test]
fn first_match_wins_and_names_the_route() {
    let text = format!(
        "{}{}[[group]]\nname = \"exits\"\nparents = [\"a\", \"b\"]\n\
         [[route]]\nname = \"ssh\"\nports = [\"22\"]\nvia = \"deny\"\n\
         [[route]]\nhosts = [\"*.corp.example\"]\nvia = \"a\"\n\
         [[route]]\nname = \"chain\"\nusers = [\"bob\"]\nvia = [\"a\", \"b\"]\n\
         [[route]]\nname = \"pool\"\nvia = \"exits\"\n\
         [[route]]\nname = \"never\"\nvia = \"direct\"\n",
        parent("a", 1, ""),
        parent("b", 2, "")
    );
    let r = routes(&text);
    assert!(!r.is_empty());
    let corp = Request { host: "intranet.corp.example", ..req() };
    assert_eq!(r.choose(&Request { port: 22, ..corp }), Choice::Deny { route: "ssh" });
    assert_eq!(
        r.choose(&corp),
        Choice::Path { route: "route 2", hops: &[Hop::Parent(0)], egress: None }
    );
    let bob = Request { user: Some("bob"), ..req() };
    let chain = [Hop::Parent(0), Hop::Parent(1)];
    assert_eq!(r.choose(&bob), Choice::Path { route: "chain", hops: &chain, egress: None });
    assert_eq!(
        r.choose(&req()),
        Choice::Path { route: "pool", hops: &[Hop::Group(0)], egress: None }
    );
    assert_eq!(
        (r.route_name(0), r.route_name(1), r.route_name(9)),
        ("ssh", "route 2", "unknown route")
    );
    assert_eq!((r.hop_name(&Hop::Group(0)), r.hop_name(&Hop::Parent(1))), ("exits", "b"));
    assert_eq!(r.group_name(0), "exits");
}

/// Picks `n` times from group 0; counts by parent name.
fn tally(
    r: &Routes,
    n: usize,
    user: Option<&str>,
    client: IpAddr,
    now: Instant,
) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for _ in 0..n {
        let name = match r.pick(&Hop::Group(0), user, client, now) {
            Pick::Parent(p) => p.name.to_string(),
            other => format!("{other:?}"),
        };
        *out.entry(name).or_insert(0) += 1;
    }
    out
}

#[test]
fn a_group_picks_by_weight() {
    let text = format!(
        "{}{}[[group]]\nname = \"g\"\nparents = [\"a\", \"b\"]\n",
        parent("a", 1, "weight = 3"),
        parent("b", 2, "")
    );
    let r = routes(&text);
    let now = Instant::now();
    let counts = tally(&r, 1000, None, ip("192.0.2.1"), now);
    let a = counts.get("a").copied().unwrap_or(0);
    assert_eq!(a + counts.get("b").copied().unwrap_or(0), 1000, "{counts:?}");
    assert!((730..=770).contains(&a), "3:1 over 1,000 picks: {counts:?}");
    // Any run is close to its share too, not only the whole.
    let counts = tally(&r, 100, None, ip("192.0.2.1"), now);
    assert!((70..=80).contains(&counts["a"]), "{counts:?}");
    // Three members 1:2:5.
    let text = format!(
        "{}{}{}[[group]]\nname = \"g\"\nparents = [\"a\", \"b\", \"c\"]\n",
        parent("a", 1, ""),
        parent("b", 2, "weight = 2"),
        parent("c", 3, "weight = 5")
    );
    let counts = tally(&routes(&text), 8000, None, ip("192.0.2.1"), now);
    for (name, share) in [("a", 1000), ("b", 2000), ("c", 5000)] {
        let got = counts[name];
        assert!(got.abs_diff(share) <= share / 25, "{name}: {counts:?}");
    }
}

#[test]
fn members_that_are_down_are_skipped_until_their_time_is_up() {
    let text = format!(
        "{}{}[[group]]\nname = \"g\"\nparents = [\"a\", \"b\"]\n",
        parent("a", 1, "max_failures = 2\ndown_for = \"30s\""),
        parent("b", 2, "")
    );
    let r = routes(&text);
    let now = Instant::now();
    let a = r.parent(0);
    assert!(!a.failed(now), "one failure of two");
    assert!(a.is_up(now));
    assert!(a.failed(now), "the second marks it down");
    assert!(!a.is_up(now));
    let counts = tally(&r, 100, None, ip("192.0.2.1"), now);
    assert_eq!(counts.get("b"), Some(&100), "{counts:?}");
    let later = now + Duration::from_secs(30);
    assert!(a.is_up(later), "tried again after down_for");
    let counts = tally(&r, 100, None, ip("192.0.2.1"), later);
    assert!((45..=55).contains(&counts["a"]), "{counts:?}");
}

#[test]
fn health_marks_down_after_n_failures_and_half_opens() {
    let h = Health::default();
    let t0 = Instant::now();
    let down_for = Duration::from_secs(10);
    assert!(!h.failed(t0, 3, down_for));
    assert!(!h.failed(t0, 3, down_for));
    assert!(h.is_up(t0));
    assert!(h.failed(t0, 3, down_for), "the third failure marks it down");
    assert!(!h.is_up(t0) && !h.is_up(t0 + Duration::from_millis(9_999)));
    assert!(!h.failed(t0 + Duration::from_secs(1), 3, down_for), "already down");
    assert!(!h.is_up(t0 + Duration::from_millis(9_999)), "a late failure does not extend it");
    let t1 = t0 + down_for;
    assert!(h.is_up(t1), "back after down_for");
    assert!(h.failed(t1, 3, down_for), "half-open: one failure marks it down again");
    assert!(!h.is_up(t1 + Duration::from_secs(9)));
    assert!(h.is_up(t1 + down_for));
    assert!(h.succeeded(), "it had been down");
    assert_eq!(h.failures(), 0);
    assert!(h.is_up(t1));
    assert!(!h.failed(t1, 3, down_for), "a success starts the count again");
    assert!(!h.succeeded(), "it was not down");
    // Successes between failures reset the count.
    for _ in 0..10 {
        assert!(!h.failed(t1, 2, down_for));
        h.succeeded();
    }
    // max_failures = 0: never down.
    for _ in 0..100 {
        assert!(!h.failed(t1, 0, down_for));
    }
    assert!(h.is_up(t1));
}

#[test]
fn a_lone_parent_that_is_down_is_refused_by_name() {
    let r = routes(&parent("corp", 1, "max_failures = 1"));
    let now = Instant::now();
    let client = ip("192.0.2.1");
    assert!(
        matches!(r.pick(&Hop::Parent(0), None, client, now), Pick::Parent(p) if &*p.name == "corp")
    );
    assert!(r.parent(0).failed(now));
    assert_eq!(
        r.pick(&Hop::Parent(0), None, client, now),
        Pick::Deny("parent \"corp\" (10.0.0.1:3128) is down".into())
    );
    assert!(r.parent(0).succeeded());
    assert!(matches!(r.pick(&Hop::Parent(0), None, client, now), Pick::Parent(_)));
    // A hop of another table is refused, not a panic.
    assert!(matches!(r.pick(&Hop::Parent(1), None, client, now), Pick::Deny(_)));
    assert!(matches!(r.pick(&Hop::Group(0), None, client, now), Pick::Deny(_)));
}

#[test]
fn sticky_users_keep_their_parent() {
    let text = format!(
        "{}{}{}[[group]]\nname = \"g\"\nparents = [\"a\", \"b\", \"c\"]\nsticky = \"user\"\n",
        parent("a", 1, "max_failures = 1"),
        parent("b", 2, "max_failures = 1"),
        parent("c", 3, "max_failures = 1")
    );
    let r = routes(&text);
    let now = Instant::now();
    let client = ip("192.0.2.1");
    let of = |user: &str, now| match r.pick(&Hop::Group(0), Some(user), client, now) {
        Pick::Parent(p) => p.index,
        other => panic!("{other:?}"),
    };
    let alice = of("alice", now);
    let counts = tally(&r, 1000, Some("alice"), client, now);
    assert_eq!(counts.len(), 1, "{counts:?}");
    // Where 300 users go, then with alice's parent down.
    let users: Vec<String> = (0..300).map(|i| format!("user{i}")).collect();
    let before: Vec<usize> = users.iter().map(|u| of(u, now)).collect();
    for p in 0..3 {
        let share = before.iter().filter(|&&b| b == p).count();
        assert!((70..=130).contains(&share), "parent {p}: {share} of 300");
    }
    assert!(r.parent(alice).failed(now));
    let moved = of("alice", now);
    assert_ne!(moved, alice);
    assert_eq!(tally(&r, 1000, Some("alice"), client, now).len(), 1, "moved once, stays");
    for (u, &b) in users.iter().zip(&before) {
        let now_at = of(u, now);
        if b == alice {
            assert_ne!(now_at, alice, "{u}");
        } else {
            assert_eq!(now_at, b, "{u}: only the users of the parent that went down move");
        }
    }
    // Back up: everyone returns.
    r.parent(alice).succeeded();
    let after: Vec<usize> = users.iter().map(|u| of(u, now)).collect();
    assert_eq!(after, before);
    assert_eq!(of("alice", now), alice);
}

#[test]
fn sticky_hashing_follows_the_weights() {
    let text = format!(
        "{}{}[[group]]\nname = \"g\"\nparents = [\"a\", \"b\"]\nsticky = \"client\"\n",
        parent("a", 1, "weight = 3"),
        parent("b", 2, "")
    );
    let r = routes(&text);
    let now = Instant::now();
    let mut a = 0;
    for i in 0..1000u32 {
        let client = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        if let Pick::Parent(p) = r.pick(&Hop::Group(0), Some("ignored"), client, now) {
            a += usize::from(&*p.name == "a");
        }
    }
    assert!((700..=800).contains(&a), "3:1 over 1,000 clients: {a}");
}

#[test]
fn anonymous_users_stick_by_client_address() {
    let text = format!(
        "{}{}[[group]]\nname = \"g\"\nparents = [\"a\", \"b\"]\nsticky = \"user\"\n",
        parent("a", 1, ""),
        parent("b", 2, "")
    );
    let r = routes(&text);
    let now = Instant::now();
    let mut seen = std::collections::HashSet::new();
    for i in 0..64u8 {
        let client = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, i));
        let counts = tally(&r, 20, None, client, now);
        assert_eq!(counts.len(), 1, "{counts:?}");
        seen.extend(counts.into_keys());
        // IPv4-mapped IPv6 is the same client.
        let mapped = IpAddr::V6(std::net::Ipv4Addr::new(192, 0, 2, i).to_ipv6_mapped());
        assert_eq!(tally(&r, 1, None, mapped, now), tally(&r, 1, None, client, now));
    }
    assert_eq!(seen.len(), 2, "clients are spread over both: {seen:?}");
}

#[test]
fn fallbacks_when_every_member_is_down() {
    let parents = format!(
        "{}{}{}",
        parent("a", 1, "max_failures = 1"),
        parent("b", 2, "max_failures = 1"),
        parent("c", 3, "max_failures = 1")
    );
    let now = Instant::now();
    fn pick(r: &Routes) -> Pick<'_> {
        r.pick(&Hop::Group(0), None, ip("192.0.2.1"), Instant::now())
    }
    let group = |fallback: &str| {
        format!(
            "{parents}[[group]]\nname = \"g\"\nparents = [\"a\"]\nfallback = \"{fallback}\"\n\
             [[group]]\nname = \"spare\"\nparents = [\"b\"]\nfallback = \"c\"\n"
        )
    };
    let r = routes(&group("deny"));
    r.parent(0).failed(now);
    assert_eq!(pick(&r), Pick::Deny("every parent of group `g` is down".into()));
    let r = routes(&group("direct"));
    r.parent(0).failed(now);
    assert_eq!(pick(&r), Pick::Direct);
    let r = routes(&group("spare"));
    r.parent(0).failed(now);
    assert!(matches!(pick(&r), Pick::Parent(p) if &*p.name == "b"));
    r.parent(1).failed(now);
    assert!(matches!(pick(&r), Pick::Parent(p) if &*p.name == "c"), "spare's own fallback");
    r.parent(2).failed(now);
    assert_eq!(
        pick(&r),
        Pick::Deny(
            "every parent of group `g` is down, and so is every parent of its fallback \
             `spare`, and so is its fallback parent \"c\" (10.0.0.3:3128)"
                .into()
        )
    );
    r.parent(0).succeeded();
    assert!(matches!(pick(&r), Pick::Parent(p) if &*p.name == "a"));
    // A fallback parent, up and down.
    let r = routes(&group("b"));
    r.parent(0).failed(now);
    assert!(matches!(pick(&r), Pick::Parent(p) if &*p.name == "b"));
    r.parent(1).failed(now);
    assert!(matches!(pick(&r), Pick::Deny(why) if why.contains("parent \"b\"")));
}

#[test]
fn health_survives_a_reload_when_the_parent_is_the_same() {
    let now = Instant::now();
    let old = routes(&format!(
        "{}{}",
        parent("a", 1, "max_failures = 1"),
        parent("b", 2, "max_failures = 1")
    ));
    old.parent(0).failed(now);
    old.parent(1).failed(now);
    // a unchanged (but another weight), b moved elsewhere, c new.
    let mut new = routes(&format!(
        "{}{}{}",
        parent("a", 1, "weight = 2\nmax_failures = 1"),
        parent("b", 9, "max_failures = 1"),
        parent("c", 3, "")
    ));
    new.keep_health_of(&old);
    assert!(!new.parent(0).is_up(now), "a keeps its health");
    assert!(new.parent(1).is_up(now), "b is another parent now");
    assert!(new.parent(2).is_up(now));
    assert_eq!(new.parent(0).weight, 2);
    // Shared: a connection opened under the old policy reports to the same health.
    old.parent(0).succeeded();
    assert!(new.parent(0).is_up(now));
    // Another kind is another parent.
    let mut socks = routes(
        "[[parent]]\nname = \"a\"\nkind = \"socks5\"\naddress = \"10.0.0.1:3128\"\nmax_failures = 1\n",
    );
    old.parent(0).failed(now);
    socks.keep_health_of(&old);
    assert!(socks.parent(0).is_up(now));
}

#[test]
fn parents_are_compiled_and_never_show_the_password() {
    let r = routes(
        "[[parent]]\nname = \"s\"\nkind = \"socks5\"\naddress = \"[2001:db8::1]:1080\"\nuser = \"u\"\n\
         password = \"hunter2\"\nprobe = \"tcp\"\n\
         [[parent]]\nname = \"t\"\nkind = \"https\"\naddress = \"proxy.example:443\"\nca = \"ca.pem\"\n\
         pass_user = true\nuser = \"fallback\"\npassword = \"pw\"\n\
         [[parent]]\nname = \"n\"\nkind = \"https\"\naddress = \"p.example:443\"\nserver_name = \"other.example\"\n",
    );
    let s = r.parent(0);
    assert_eq!((s.kind, &*s.host, s.port), (ParentKind::Socks5, "2001:db8::1", 1080));
    assert_eq!(s.password.as_ref().map(Secret::expose), Some("hunter2"));
    assert_eq!((s.probe.clone(), s.probe_every), (Some(Probe::Tcp), Duration::from_secs(10)));
    assert_eq!(s.to_string(), "parent \"s\" ([2001:db8::1]:1080)");
    let shown = format!("{s:?} {r:?}");
    assert!(!shown.contains("hunter2") && shown.contains("***"), "{shown}");
    let t = r.parent(1);
    assert_eq!(&*t.server_name, "proxy.example");
    assert_eq!(t.user_for(Some("alice")), Some("alice"));
    assert_eq!(t.user_for(None), Some("fallback"));
    assert_eq!(s.user_for(Some("alice")), Some("u"));
    assert_eq!(&*r.parent(2).server_name, "other.example");
    assert_eq!(r.parents().iter().map(|p| p.index).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn build_refuses_what_the_loader_refuses_and_own_addresses() {
    let mut cfg = Config::parse(&parent("corp", 1, "")).expect("valid");
    let own: SocketAddr = "0.0.0.0:3128".parse().expect("addr");
    assert!(Routes::build(&cfg, &[own]).is_ok(), "10.0.0.1 is not known to be local");
    cfg.parents[0].address = "127.0.0.1:3128".parse().expect("addr");
    let e = Routes::build(&cfg, &[own]).expect_err("loop");
    assert!(e[0].contains("own listening address 0.0.0.0:3128"), "{e:?}");
    cfg.parents[0].address = "localhost:3128".parse().expect("addr");
    assert!(Routes::build(&cfg, &["[::1]:3128".parse().expect("addr")]).is_err());
    assert!(Routes::build(&cfg, &["[::1]:3129".parse().expect("addr")]).is_ok());
    cfg.parents[0].address = "10.0.0.1:3128".parse().expect("addr");
    cfg.parents[0].weight = 0;
    let e = Routes::build(&cfg, &[]).expect_err("weight 0");
    assert!(e[0].contains("weight 0"), "{e:?}");
}

/// Three parents in group `g`, a route `pool` through it sticky by `by`.
fn sticky_routes(by: &str, extra: &str) -> Routes {
    routes(&format!(
        "{}{}{}[[group]]\nname = \"g\"\nparents = [\"a\", \"b\", \"c\"]\n\
         [[route]]\nname = \"pool\"\nvia = \"g\"\nsticky = \"{by}\"\n{extra}\n",
        parent("a", 1, ""),
        parent("b", 2, ""),
        parent("c", 3, "")
    ))
}

fn member(r: &Routes, seed: Option<u64>) -> String {
    match r.pick_seeded(&Hop::Group(0), None, ip("192.0.2.1"), seed, Instant::now()) {
        Pick::Parent(p) => p.name.to_string(),
        other => format!("{other:?}"),
    }
}

#[test]
fn a_seed_picks_the_member_whatever_the_group_says() {
    let r = sticky_routes("user", "");
    // A group picking by weight turns round; with a seed it stays put.
    for seed in [1u64, 2, 3, 0xdead_beef] {
        let first = member(&r, Some(seed));
        assert!((0..20).all(|_| member(&r, Some(seed)) == first), "seed {seed}");
    }
    // Seeds spread over the members.
    let mut seen = std::collections::HashSet::new();
    for seed in 0..200u64 {
        seen.insert(member(&r, Some(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))));
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn route_seeds_by_user_or_session() {
    let now = crate::limits::now;
    let session = |s: &str, ttl: Option<u64>| crate::acl::Params {
        session: Some(s.into()),
        ttl: ttl.map(Duration::from_secs),
        ..Default::default()
    };
    let r = sticky_routes("user", "sticky_ttl = \"10m\"");
    let alice = r.seed("pool", Some("alice"), None, now());
    assert!(alice.is_some());
    // By user: session ids aside; another user, another seed; anonymous, none.
    assert_eq!(r.seed("pool", Some("alice"), Some(&session("x", None)), now()), alice);
    assert_ne!(r.seed("pool", Some("bob"), None, now()), alice);
    assert_eq!(r.seed("pool", None, None, now()), None);
    assert_eq!(r.seed("other", Some("alice"), None, now()), None);
    tokio::time::advance(Duration::from_secs(600)).await;
    assert_ne!(r.seed("pool", Some("alice"), None, now()), alice, "expired after sticky_ttl");

    let r = sticky_routes("session", "");
    let x = r.seed("pool", Some("alice"), Some(&session("x", None)), now());
    let y = r.seed("pool", Some("alice"), Some(&session("y", Some(5))), now());
    assert!(x.is_some() && y.is_some() && x != y);
    assert_eq!(r.seed("pool", Some("alice"), None, now()), None, "no session id: not sticky");
    assert_ne!(r.seed("pool", Some("bob"), Some(&session("x", None)), now()), x);
    // `ttl` in the user name: y lasts 5 s, x the default 10 minutes.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(r.seed("pool", Some("alice"), Some(&session("x", None)), now()), x);
    assert_ne!(r.seed("pool", Some("alice"), Some(&session("y", Some(5))), now()), y);
    // A reload keeps the sessions.
    let mut again = sticky_routes("session", "");
    again.keep_health_of(&r);
    assert_eq!(again.seed("pool", Some("alice"), Some(&session("x", None)), now()), x);
}

#[tokio::test(start_paused = true)]
async fn sessions_per_user_from_the_limits() {
    let now = crate::limits::now;
    let session = |s: &str| crate::acl::Params { session: Some(s.into()), ..Default::default() };
    let text = |per_user: usize| {
        format!(
            "[limits]\nmax_sticky_sessions_per_user = {per_user}\n{}{}[[group]]\nname = \"g\"\n\
             parents = [\"a\", \"b\"]\n[[route]]\nname = \"pool\"\nvia = \"g\"\n\
             sticky = \"session\"\n",
            parent("a", 1, ""),
            parent("b", 1, "")
        )
    };
    let r = routes(&text(2));
    let seed =
        |r: &Routes, user: &str, s: &str| r.seed("pool", Some(user), Some(&session(s)), now());
    let (x, y) = (seed(&r, "alice", "x"), seed(&r, "alice", "y"));
    assert!(x.is_some() && y.is_some());
    assert_eq!(seed(&r, "alice", "z"), None, "alice is at her bound");
    assert!(seed(&r, "bob", "z").is_some(), "bob is not");
    // A reload under the same limits keeps the sessions; another bound starts afresh.
    let mut same = routes(&text(2));
    same.keep_health_of(&r);
    assert_eq!((seed(&same, "alice", "x"), seed(&same, "alice", "z")), (x, None));
    let mut other = routes(&text(3));
    other.keep_health_of(&r);
    assert!(seed(&other, "alice", "x").is_some_and(|s| Some(s) != x));
    // 0: no bound but the table's.
    let r = routes(&text(0));
    assert!((0..50).all(|i| seed(&r, "alice", &i.to_string()).is_some()));
}

#[test]
fn no_sticky_route_no_table() {
    let r = routes(&format!("{}[[route]]\nname = \"p\"\nvia = \"a\"\n", parent("a", 1, "")));
    assert!(r.sessions.is_none());
    assert_eq!(r.seed("p", Some("alice"), None, Instant::now()), None);
}
