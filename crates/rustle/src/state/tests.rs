use super::*;
use crate::config::QuotaConfig;

fn quota(name: &str, bytes: u64, period: Period) -> QuotaConfig {
    QuotaConfig {
        name: name.into(),
        users: vec!["ann".into()],
        groups: vec!["staff".into()],
        bytes,
        direction: QuotaDirection::Both,
        period,
        on_exceeded: OnExceeded::Finish,
    }
}

fn ts(text: &str) -> Timestamp {
    text.parse().expect("timestamp")
}

fn local(secs: i64, tz: &str) -> String {
    Timestamp::from_second(secs)
        .expect("in range")
        .to_zoned_datetime(TimeZone::get(tz).expect("zone"))
        .strftime("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

#[test]
fn calendar_periods_in_a_zone() {
    let berlin = TimeZone::get("Europe/Berlin").expect("tz database");
    // (period, now, start, next), local times in Berlin.
    let table: &[(Period, &str, &str, &str)] = &[
        (
            Period::Day,
            "2026-12-03T23:30:00Z",
            "2026-12-04T00:00:00+01:00",
            "2026-12-05T00:00:00+01:00",
        ),
        (
            Period::Day,
            "2026-12-03T22:59:59Z",
            "2026-12-03T00:00:00+01:00",
            "2026-12-04T00:00:00+01:00",
        ),
        // The spring change: a 23-hour day.
        (
            Period::Day,
            "2026-03-29T12:00:00Z",
            "2026-03-29T00:00:00+01:00",
            "2026-03-30T00:00:00+02:00",
        ),
        // The autumn change: a 25-hour day.
        (
            Period::Day,
            "2026-10-25T12:00:00Z",
            "2026-10-25T00:00:00+02:00",
            "2026-10-26T00:00:00+01:00",
        ),
        // Thursday 3 December: the week began on Monday 30 November.
        (
            Period::Week,
            "2026-12-03T10:00:00Z",
            "2026-11-30T00:00:00+01:00",
            "2026-12-07T00:00:00+01:00",
        ),
        // Sunday night, still the week of Monday 23 November.
        (
            Period::Week,
            "2026-11-29T22:59:00Z",
            "2026-11-23T00:00:00+01:00",
            "2026-11-30T00:00:00+01:00",
        ),
        // Month ends: February (28 days), and a month across the autumn change.
        (
            Period::Month,
            "2026-02-28T22:59:59Z",
            "2026-02-01T00:00:00+01:00",
            "2026-03-01T00:00:00+01:00",
        ),
        (
            Period::Month,
            "2026-10-31T23:00:00Z",
            "2026-11-01T00:00:00+01:00",
            "2026-12-01T00:00:00+01:00",
        ),
        (
            Period::Month,
            "2026-10-15T00:00:00Z",
            "2026-10-01T00:00:00+02:00",
            "2026-11-01T00:00:00+01:00",
        ),
        (
            Period::Month,
            "2028-02-29T12:00:00Z",
            "2028-02-01T00:00:00+01:00",
            "2028-03-01T00:00:00+01:00",
        ),
    ];
    for (period, now, start, next) in table {
        let (a, b) = bucket(*period, &berlin, ts(now));
        assert_eq!(
            (local(a, "Europe/Berlin").as_str(), local(b, "Europe/Berlin").as_str()),
            (*start, *next),
            "{period:?} at {now}"
        );
    }
    let (a, b) = bucket(Period::Day, &TimeZone::UTC, ts("2026-12-03T23:30:00Z"));
    assert_eq!(
        (a, b),
        (ts("2026-12-03T00:00:00Z").as_second(), ts("2026-12-04T00:00:00Z").as_second())
    );
}

#[test]
fn rolling_windows_are_hourly_buckets_for_a_day() {
    let day = Period::Rolling(Duration::from_secs(86_400));
    let (a, b) = bucket(day, &TimeZone::UTC, ts("2026-12-03T10:20:00Z"));
    assert_eq!(a, ts("2026-12-03T10:00:00Z").as_second());
    assert_eq!(b - a, 3600);
}

/// A table with ann's counters, looked at on an injected clock.
fn setup(quotas: &[QuotaConfig]) -> (Table, Arc<Traffic>, Arc<UserTraffic>) {
    let traffic = Traffic::new();
    let ann = traffic.entry("ann");
    let table = Table::new(quotas, TimeZone::UTC);
    (table, traffic, ann)
}

#[test]
fn a_used_up_quota_refuses_until_its_period_rolls_over() {
    let (mut t, traffic, ann) = setup(&[quota("daily", 1000, Period::Day)]);
    t.tick(ts("2026-12-03T10:00:00Z"), &traffic);
    assert!(ann.over_quota().is_none());
    ann.add(crate::limits::Direction::Down, 600);
    t.tick(ts("2026-12-03T10:00:01Z"), &traffic);
    assert!(ann.over_quota().is_none());
    ann.add(crate::limits::Direction::Up, 400);
    t.tick(ts("2026-12-03T10:00:02Z"), &traffic);
    let refusal = ann.over_quota().expect("used up").to_string();
    assert_eq!(refusal, "quota \"daily\" used up (1000 bytes); resets 2026-12-04T00:00:00+00:00");
    assert!(!ann.cut(), "finish: open tunnels go on");
    assert_eq!(
        t.usage("ann", ts("2026-12-03T12:00:00Z")),
        vec![("daily".into(), 1000, 1000, "2026-12-04T00:00:00+00:00".into())]
    );
    // Midnight: a new period.
    t.tick(ts("2026-12-04T00:00:00Z"), &traffic);
    assert!(ann.over_quota().is_none());
    assert_eq!(t.usage("ann", ts("2026-12-04T00:00:01Z"))[0].1, 0);
}

#[test]
fn direction_close_and_groups() {
    let mut q = quota("in", 100, Period::Week);
    q.direction = QuotaDirection::In;
    q.on_exceeded = OnExceeded::Close;
    q.users.clear();
    let (mut t, traffic, ann) = setup(&[q]);
    t.groups.insert("ann".into(), vec!["staff".into()]);
    ann.add(crate::limits::Direction::Up, 1000);
    t.tick(ts("2026-12-03T10:00:00Z"), &traffic);
    assert!(ann.over_quota().is_none(), "uploads do not count towards an \"in\" quota");
    ann.add(crate::limits::Direction::Down, 100);
    t.tick(ts("2026-12-03T10:00:01Z"), &traffic);
    assert!(ann.over_quota().is_some());
    assert!(ann.cut());
    // Ann leaves the group: the quota no longer applies, at once.
    let cfg = t.quotas.clone();
    let cfgs: Vec<QuotaConfig> = cfg
        .iter()
        .map(|q| QuotaConfig {
            name: q.name.to_string(),
            users: q.users.clone(),
            groups: q.groups.clone(),
            bytes: q.bytes,
            direction: q.direction,
            period: q.period,
            on_exceeded: OnExceeded::Close,
        })
        .collect();
    t.configure(&cfgs, TimeZone::UTC, HashMap::new());
    t.tick(ts("2026-12-03T10:00:02Z"), &traffic);
    assert!(ann.over_quota().is_none() && !ann.cut());
}

#[test]
fn reset_top_up_and_reload() {
    let (mut t, traffic, ann) =
        setup(&[quota("daily", 1000, Period::Day), quota("monthly", 5000, Period::Month)]);
    ann.add(crate::limits::Direction::Down, 1500);
    let now = ts("2026-12-03T10:00:00Z");
    t.tick(now, &traffic);
    assert!(ann.over_quota().expect("over").to_string().contains("\"daily\""));
    // Top up: 1000 more today only.
    assert!(t.top_up("ann", "daily", 1000, now));
    assert!(!t.top_up("ann", "nope", 1000, now));
    t.tick(now, &traffic);
    assert!(ann.over_quota().is_none());
    let u = t.usage("ann", now);
    assert_eq!((u[0].1, u[0].2), (1500, 2000));
    // The top-up ends with the day.
    assert_eq!(t.usage("ann", ts("2026-12-04T01:00:00Z"))[0].2, 1000);
    // Reset of one quota.
    assert!(t.reset("ann", Some("daily")));
    assert_eq!(t.usage("ann", now)[0].1, 0);
    assert_eq!(t.usage("ann", now)[1].1, 1500);
    // A reload raising the limit applies at once; one removing a quota drops its usage.
    ann.add(crate::limits::Direction::Down, 4000);
    t.tick(now, &traffic);
    assert!(ann.over_quota().expect("over").to_string().contains("\"daily\""));
    t.configure(&[quota("daily", 10_000, Period::Day)], TimeZone::UTC, HashMap::new());
    t.tick(now, &traffic);
    assert!(ann.over_quota().is_none());
    assert_eq!(t.metrics(now).len(), 1);
    // Reset of all.
    assert!(t.reset("ann", None));
    assert_eq!(t.usage("ann", now)[0].1, 0);
}

#[test]
fn rolling_window_falls_a_bucket_at_a_time() {
    let (mut t, traffic, ann) =
        setup(&[quota("r", 1000, Period::Rolling(Duration::from_secs(86_400)))]);
    ann.add(crate::limits::Direction::Down, 600);
    t.tick(ts("2026-12-03T10:10:00Z"), &traffic);
    ann.add(crate::limits::Direction::Down, 400);
    t.tick(ts("2026-12-03T11:10:00Z"), &traffic);
    let refusal = ann.over_quota().expect("over").to_string();
    assert!(refusal.ends_with("resets 2026-12-04T10:00:00+00:00"), "{refusal}");
    t.tick(ts("2026-12-04T09:59:59Z"), &traffic);
    assert!(ann.over_quota().is_some());
    t.tick(ts("2026-12-04T10:00:00Z"), &traffic);
    assert!(ann.over_quota().is_none());
    assert_eq!(t.usage("ann", ts("2026-12-04T10:00:00Z"))[0].1, 400);
}

#[test]
fn the_keeper_keeps_usage_in_its_file() {
    let dir = std::env::temp_dir().join(format!("rustle-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("usage.json");
    let _ = std::fs::remove_file(&path);
    let mut cfg = crate::config::Config {
        quotas: vec![quota("daily", 1000, Period::Day)],
        ..Default::default()
    };
    cfg.state.path = Some(path.clone());
    let now = Arc::new(Mutex::new(ts("2026-12-03T10:00:00Z")));
    let clock: Clock = {
        let now = now.clone();
        Arc::new(move || *lock(&now))
    };
    let traffic = Traffic::new();
    let keeper = Keeper::start_with_clock(&cfg, traffic.clone(), HashMap::new(), clock.clone())
        .expect("keeper");
    traffic.entry("ann").add(crate::limits::Direction::Down, 1200);
    keeper.stop();
    // A new process: the user is refused from the start.
    let traffic = Traffic::new();
    let keeper = Keeper::start_with_clock(&cfg, traffic.clone(), HashMap::new(), clock.clone())
        .expect("keeper");
    assert_eq!(keeper.usage("ann")[0].1, 1200);
    assert!(traffic.entry("ann").over_quota().is_some());
    assert!(keeper.top_up("ann", "daily", 500));
    assert!(traffic.entry("ann").over_quota().is_none());
    assert!(keeper.reset("ann", None));
    assert_eq!(keeper.metrics(), vec![("daily".into(), "ann".into(), 0, 1000, false)]);
    // A takeover's hand-over writes, and this process writes no more.
    keeper.hand_over();
    traffic.entry("ann").add(crate::limits::Direction::Down, 5000);
    keeper.stop();
    let keeper =
        Keeper::start_with_clock(&cfg, Traffic::new(), HashMap::new(), clock).expect("keeper");
    assert_eq!(keeper.usage("ann")[0].1, 0);
    keeper.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
