use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// `-` as separator, `country` in {de, us, uk_1}, ttl at most an hour.
fn declared() -> Declared {
    Declared {
        separator: "-".into(),
        max_ttl: Duration::from_secs(3600),
        choices: Box::new([(
            "country".into(),
            Box::new(["de".into(), "us".into(), "uk_1".into()]) as Box<[Box<str>]>,
        )]),
    }
}

/// Users: `alice`, a user holding the separator (`al-ice`), one that looks like a user
/// with parameters (`bob-country-de`), and `bob`.
fn is_user(name: &str) -> bool {
    ["alice", "al-ice", "bob", "bob-country-de"].contains(&name)
}

fn params(session: Option<&str>, ttl: Option<u64>, choices: &[(&str, &str)]) -> Params {
    Params {
        session: session.map(Into::into),
        ttl: ttl.map(Duration::from_secs),
        choices: choices.iter().map(|(n, v)| ((*n).into(), (*v).into())).collect(),
    }
}

type Expected = (&'static str, Result<Option<Params>, ParamError>);

#[test]
fn table() {
    let long_session = "s".repeat(65);
    let long_session = format!("alice-session-{long_session}");
    let very_long = format!("alice-country-de{}", "-country-de".repeat(30));
    let unknown = |s: &str| Err(ParamError::Unknown(s.into()));
    let cases: Vec<(&str, Expected)> = vec![
        // Plain users, with or without the separator in them.
        ("alice", ("alice", Ok(None))),
        ("al-ice", ("al-ice", Ok(None))),
        ("bob-country-de", ("bob-country-de", Ok(None))),
        // Each parameter.
        ("alice-session-x7k2", ("alice", Ok(Some(params(Some("x7k2"), None, &[]))))),
        ("alice-ttl-10m", ("alice", Ok(Some(params(None, Some(600), &[]))))),
        ("alice-ttl-90", ("alice", Ok(Some(params(None, Some(90), &[]))))),
        ("alice-country-de", ("alice", Ok(Some(params(None, None, &[("country", "de")]))))),
        ("alice-session-x7k2-ttl-10m", ("alice", Ok(Some(params(Some("x7k2"), Some(600), &[]))))),
        (
            "al-ice-country-uk_1-session-A_9",
            ("al-ice", Ok(Some(params(Some("A_9"), None, &[("country", "uk_1")])))),
        ),
        // A ttl over the maximum is cut to it.
        ("alice-ttl-1d", ("alice", Ok(Some(params(None, Some(3600), &[]))))),
        ("alice-ttl-400d", ("alice", Ok(Some(params(None, Some(3600), &[]))))),
        ("alice-ttl-99999999999999999999", ("alice", Ok(Some(params(None, Some(3600), &[]))))),
        ("alice-ttl-99999999999999999999y", ("alice", Ok(Some(params(None, Some(3600), &[]))))),
        // The longest user wins: `bob-country-de` then `-session-a`.
        ("bob-country-de-session-a", ("bob-country-de", Ok(Some(params(Some("a"), None, &[]))))),
        ("bob-country-us", ("bob", Ok(Some(params(None, None, &[("country", "us")]))))),
        // Unknown parameters, bad values, duplicates.
        ("alice-colour-red", ("alice", unknown("colour"))),
        ("alice-Session-a", ("alice", unknown("Session"))),
        (
            "alice-country-fr",
            ("alice", Err(ParamError::BadValue { name: "country".into(), value: "fr".into() })),
        ),
        (
            "alice-country-DE",
            ("alice", Err(ParamError::BadValue { name: "country".into(), value: "DE".into() })),
        ),
        ("alice-session-a-session-b", ("alice", Err(ParamError::Duplicate("session".into())))),
        ("alice-ttl-1m-ttl-2m", ("alice", Err(ParamError::Duplicate("ttl".into())))),
        ("alice-country-de-country-de", ("alice", Err(ParamError::Duplicate("country".into())))),
        ("alice-session-a.b", ("alice", Err(ParamError::BadSession))),
        ("alice-session-é", ("alice", Err(ParamError::BadSession))),
        (long_session.as_str(), ("alice", Err(ParamError::BadSession))),
        ("alice-ttl-0s", ("alice", Err(ParamError::BadTtl("0s".into())))),
        ("alice-ttl-soon", ("alice", Err(ParamError::BadTtl("soon".into())))),
        // Empty parts and separators at the ends.
        ("alice-", ("alice", Err(ParamError::EmptyName))),
        ("alice--session-a", ("alice", Err(ParamError::EmptyName))),
        ("alice-session-", ("alice", Err(ParamError::NoValue("session".into())))),
        ("alice-session", ("alice", Err(ParamError::NoValue("session".into())))),
        ("alice-session-a-", ("alice", Err(ParamError::EmptyName))),
        ("alice-session--", ("alice", Err(ParamError::NoValue("session".into())))),
        // No known user before a separator: the whole name, an unknown user.
        ("-alice", ("-alice", Ok(None))),
        ("mallory-session-a", ("mallory-session-a", Ok(None))),
        ("alic-session-a", ("alic-session-a", Ok(None))),
        ("", ("", Ok(None))),
        ("-", ("-", Ok(None))),
        // Very long input.
        (very_long.as_str(), ("alice", Err(ParamError::TooLong))),
    ];
    let d = declared();
    for (name, (user, expected)) in cases {
        let (got_user, got) = d.split(name, is_user);
        assert_eq!((got_user, &got), (user, &expected), "{name}");
    }
}

#[test]
fn at_most_255_bytes_what_socks5_carries() {
    let d = declared();
    // `alice-session-` and a ttl made as long as needed: 255 bytes parse, 256 do not.
    let session = "s".repeat(64);
    let name = |len: usize| {
        let head = format!("alice-session-{session}-country-de-ttl-");
        format!("{head}{}1s", "0".repeat(len - head.len() - 2))
    };
    let (at, over) = (name(MAX_LEN), name(MAX_LEN + 1));
    assert_eq!((at.len(), over.len()), (255, 256));
    let p = params(Some(&session), Some(1), &[("country", "de")]);
    assert_eq!(d.split(&at, is_user), ("alice", Ok(Some(p))));
    assert_eq!(d.split(&over, is_user), ("alice", Err(ParamError::TooLong)));
}

#[test]
fn messages_name_the_problem_and_escape_what_the_client_sent() {
    let d = declared();
    let message = |name: &str| d.split(name, is_user).1.expect_err(name).to_string();
    assert_eq!(message("alice-colour-red"), "unknown user-name parameter `colour`");
    assert_eq!(message("alice-country-fr"), "`fr` is not a value of user-name parameter `country`");
    assert_eq!(message("alice-session-a-session-b"), "user-name parameter `session` given twice");
    assert!(message("alice-session-a.b").starts_with("a session id is 1 to 64"));
    let odd = message("alice-c\u{7}\"x-1");
    assert_eq!(odd, "unknown user-name parameter `c\\u{7}\\\"x`");
    let long = message(&format!("alice-{}-1", "k".repeat(100)));
    assert!(long.ends_with("…`") && long.len() < 80, "{long}");
    // Not a line break in sight, whatever was sent.
    assert!(!message("alice-a\r\nb-1").contains(['\r', '\n']));
}

#[test]
fn other_separators() {
    let d = Declared { separator: "+".into(), ..declared() };
    assert_eq!(
        d.split("alice+session+s1", is_user),
        ("alice", Ok(Some(params(Some("s1"), None, &[]))))
    );
    assert_eq!(d.split("alice-session-s1", is_user), ("alice-session-s1", Ok(None)));
    let d = Declared { separator: "__".into(), ..declared() };
    assert_eq!(
        d.split("alice__country__de__ttl__5m", is_user),
        ("alice", Ok(Some(params(None, Some(300), &[("country", "de")]))))
    );
}

#[test]
fn a_separator_of_two_characters_may_overlap_a_user_name() {
    let d = Declared { separator: "--".into(), ..declared() };
    let is_user = |n: &str| ["al-", "bob"].contains(&n);
    let session = |s: &str| Ok(Some(params(Some(s), None, &[])));
    assert_eq!(d.split("al---session--x", is_user), ("al-", session("x")));
    assert_eq!(d.split("bob--session--y", is_user), ("bob", session("y")));
    let unknown = Err(ParamError::Unknown("-session".into()));
    assert_eq!(d.split("bob---session--y", is_user), ("bob", unknown));
}

#[test]
fn users_that_would_take_another_users_parameters() {
    let d = declared();
    let is_user = |n: &str| ["alice", "al-ice", "bob"].contains(&n);
    for (name, taken) in [
        // Parameters, or parameters and then a parameter's name: `alice-country-de` is
        // taken whole, `alice-session-x` as the longest user, `alice-session` with `x`.
        ("alice-country-de", Some("alice")),
        ("alice-session-x-ttl-5m", Some("alice")),
        ("alice-session", Some("alice")),
        ("alice-country", Some("alice")),
        ("alice-country-de-ttl", Some("alice")),
        ("al-ice-country-us", Some("al-ice")),
        ("bob-ttl-1h", Some("bob")),
        // No parameters after the user, or no user before them.
        ("alice-colour-red", None),
        ("alice-country-fr", None),
        ("alice-sess", None),
        ("alice-", None),
        ("alice--session", None),
        ("alice-country-de-colour", None),
        ("mallory-session-x", None),
        ("alicex-session-x", None),
        ("alice", None),
    ] {
        assert_eq!(d.shadows(name, is_user), taken, "{name}");
    }
}

#[test]
fn written_back() {
    let d = Declared { max_ttl: Duration::from_secs(7200), ..declared() };
    let p = params(Some("x7k2"), Some(5400), &[("country", "de")]);
    let text = d.write("alice", &p);
    assert_eq!(text, "alice-session-x7k2-ttl-1h30m-country-de");
    assert_eq!(d.split(&text, is_user), ("alice", Ok(Some(p))));
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() }
}

/// Names made of users, separators, parameter names and values, and noise, so that
/// parses succeed often enough to test the round trip.
fn name() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("alice".to_string()),
        Just("al-ice".to_string()),
        Just("bob".to_string()),
        Just("-".to_string()),
        Just("session".to_string()),
        Just("ttl".to_string()),
        Just("country".to_string()),
        Just("de".to_string()),
        Just("10m".to_string()),
        "[a-zA-Z0-9_]{1,8}",
        any::<String>(),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(config())]

    /// Any name: no panic; what parses, written back, parses the same.
    #[test]
    fn never_panics_and_round_trips(name in name()) {
        let d = declared();
        let (user, parsed) = d.split(&name, is_user);
        prop_assert!(name.starts_with(user));
        if let Ok(Some(p)) = parsed {
            let text = d.write(user, &p);
            prop_assert_eq!(d.split(&text, is_user), (user, Ok(Some(p))));
        }
    }

    #[test]
    fn any_string_never_panics(name in any::<String>(), sep in "[-+.~]{1,3}") {
        let d = Declared { separator: sep.into(), ..declared() };
        let _ = d.split(&name, |u| u.len() % 3 == 0);
    }
}

/// User names: a base, then words that look like parameters, so that some users take
/// others' parameters.
fn user_name() -> impl Strategy<Value = String> {
    let base = prop_oneof![Just("al"), Just("al-ice"), Just("ice")];
    let word = prop_oneof![
        Just("session"),
        Just("ttl"),
        Just("country"),
        Just("de"),
        Just("5m"),
        Just("x"),
        Just("ice"),
        Just(""),
    ];
    (base, proptest::collection::vec(word, 0..4))
        .prop_map(|(base, words)| words.iter().fold(base.to_string(), |n, w| n + "-" + w))
}

proptest! {
    #![proptest_config(config())]

    /// Users the configuration's check lets through (no user `shadows` another) each
    /// keep their parameters: written after any of them, they read back as that user's.
    #[test]
    fn users_the_check_lets_through_keep_their_parameters(
        users in proptest::collection::btree_set(user_name(), 1..6),
        session in proptest::option::of(prop_oneof![Just("x"), Just("s_1")]),
        ttl in proptest::option::of(prop_oneof![Just(300u64), Just(7)]),
        country in proptest::option::of(prop_oneof![Just("de"), Just("us")]),
    ) {
        let d = declared();
        let is_user = |n: &str| users.contains(n);
        prop_assume!(session.is_some() || ttl.is_some() || country.is_some());
        prop_assume!(users.iter().all(|v| d.shadows(v, is_user).is_none()));
        let choices: Vec<(&str, &str)> = country.iter().map(|c| ("country", *c)).collect();
        let p = params(session, ttl, &choices);
        for user in &users {
            let text = d.write(user, &p);
            prop_assert_eq!(d.split(&text, is_user), (user.as_str(), Ok(Some(p.clone()))), "{}", text);
        }
    }
}
