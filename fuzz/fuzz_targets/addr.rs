//! Addresses as SOCKS clients name them: a domain is taken exactly when it is 1 to 255
//! printable ASCII bytes and keeps them; an IP address prints as a socket address
//! that reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_proto::addr::{Address, Domain, Host};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fuzz_target!(|data: &[u8]| {
    match Domain::new(data) {
        Some(d) => {
            assert_eq!(d.as_bytes(), data);
            assert_eq!(d.as_str().as_bytes(), data);
            let a = Address { host: Host::Domain(d.clone()), port: 80 };
            assert_eq!(a.to_string(), format!("{}:80", d.as_str()));
        }
        None => assert!(
            data.is_empty() || data.len() > 255 || data.iter().any(|b| !b.is_ascii_graphic())
        ),
    }
    if let Some(b) = data.get(..18) {
        let port = u16::from_be_bytes([b[16], b[17]]);
        let v6: [u8; 16] = b[..16].try_into().unwrap_or_default();
        let v4: [u8; 4] = b[..4].try_into().unwrap_or_default();
        for ip in [IpAddr::V6(Ipv6Addr::from(v6)), IpAddr::V4(Ipv4Addr::from(v4))] {
            let sa = SocketAddr::new(ip, port);
            assert_eq!(Address::from(sa).to_string().parse::<SocketAddr>(), Ok(sa));
        }
    }
});
