//! The load generator through rustle: the counts it reports equal the origin's own count of
//! requests served, in each mode the campaign uses, so the benchmark figures count what
//! really happened.

use std::time::Duration;

use rustle::config::ListenerKind;
use rustle_bench::load::{self, Mode, Options};
use rustle_bench::Origin;

use crate::util::*;

fn run_through(mode: Mode, proxy: std::net::SocketAddr, origin: &Origin, close: bool) {
    let before = origin.requests();
    let mut o = Options::new(mode, origin.addr().to_string());
    o.proxy = Some(proxy.to_string());
    o.connections = 8;
    o.duration = Duration::from_millis(700);
    o.warmup = Duration::ZERO;
    o.close = close;
    let report = load::run(&o).expect("the generator runs");
    let served = origin.requests() - before;
    assert_eq!(report.errors.total(), 0, "{mode:?} close={close}: {:?}", report.errors);
    assert!(report.completed > 0, "{mode:?}: nothing completed");
    assert_eq!(report.completed, served, "{mode:?} close={close}: generator vs origin counts");
}

#[test]
fn generator_counts_match_the_origin_through_every_kind_of_listener() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|cfg| {
        let mut http = listener(ListenerKind::Http, None);
        http.h2c = true;
        cfg.listeners = vec![
            http,
            listener(ListenerKind::Socks, None),
            listener(ListenerKind::Relay, Some(origin.addr())),
        ];
        cfg.log.access = rustle::config::LogTarget::Off;
    });
    let [(_, http), (_, socks), (_, relay)] = proxy.addrs() else { panic!("three listeners") };
    for close in [false, true] {
        run_through(Mode::HttpProxy, *http, &origin, close);
        run_through(Mode::Connect, *http, &origin, close);
        run_through(Mode::Socks5, *socks, &origin, close);
        run_through(Mode::Relay, *relay, &origin, close);
        run_through(Mode::H2c, *http, &origin, close);
    }
}

#[test]
fn a_counted_run_sends_exactly_its_count_in_every_mode() {
    let origin = Origin::start().unwrap();
    let proxy = Proxy::start_with(|cfg| {
        let mut http = listener(ListenerKind::Http, None);
        http.h2c = true;
        cfg.listeners = vec![http, listener(ListenerKind::Socks, None)];
        cfg.log.access = rustle::config::LogTarget::Off;
    });
    let [(_, http), (_, socks)] = proxy.addrs() else { panic!("two listeners") };
    for (mode, proxy, close) in [
        (Mode::HttpProxy, *http, false),
        (Mode::HttpProxy, *http, true),
        (Mode::Connect, *http, true),
        (Mode::Socks5, *socks, true),
        (Mode::H2c, *http, false),
    ] {
        let before = origin.requests();
        let mut o = Options::new(mode, origin.addr().to_string());
        o.proxy = Some(proxy.to_string());
        // Three lanes on two threads share the 257 requests.
        (o.connections, o.threads, o.count, o.close) = (3, 2, Some(257), close);
        let report = load::run(&o).expect("the generator runs");
        assert_eq!(report.errors.total(), 0, "{mode:?} close={close}: {:?}", report.errors);
        assert_eq!(report.completed, 257, "{mode:?} close={close}");
        assert_eq!(origin.requests() - before, 257, "{mode:?} close={close}: origin's count");
    }
}
