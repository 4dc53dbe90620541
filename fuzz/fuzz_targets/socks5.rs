//! SOCKS5: greetings, RFC 1929 credentials, requests and UDP headers. The prefix
//! contract for each parser, and re-encoding what was parsed gives the bytes back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustle_fuzz::{encode5_addr, prefix_contract};
use rustle_proto::addr::Host;
use rustle_proto::socks5;

/// User and password, copied out of the buffer.
type UserPassword = (Vec<u8>, Vec<u8>);

fn credentials(b: &[u8]) -> Result<Option<(UserPassword, usize)>, socks5::Error> {
    Ok(socks5::parse_credentials(b)?.map(|(c, n)| ((c.user.to_vec(), c.password.to_vec()), n)))
}

fuzz_target!(|data: &[u8]| {
    // First byte: which message; at most 600 bytes of it (none is longer than 513).
    let Some((&which, rest)) = data.split_first() else { return };
    let buf = &rest[..rest.len().min(600)];
    match which % 4 {
        0 => prefix_contract(buf, socks5::parse_greeting),
        1 => {
            prefix_contract(buf, credentials);
            if let Ok(Some(((user, password), n))) = credentials(buf) {
                let mut again = vec![1, user.len() as u8];
                again.extend_from_slice(&user);
                again.push(password.len() as u8);
                again.extend_from_slice(&password);
                assert_eq!(&buf[..n], &again[..]);
            }
        }
        2 => {
            prefix_contract(buf, socks5::parse_request);
            if let Ok(Some((req, n))) = socks5::parse_request(buf) {
                let mut again = buf[..3].to_vec();
                encode5_addr(&req.dst, &mut again);
                assert_eq!(&buf[..n], &again[..]);
            }
        }
        _ => {
            if let Ok((h, n)) = socks5::parse_udp(buf) {
                let mut again = vec![0, 0, h.frag];
                encode5_addr(&h.dst, &mut again);
                assert_eq!(&buf[..n], &again[..]);
                if let Host::Ip(ip) = h.dst.host {
                    let mut written = Vec::new();
                    socks5::write_udp_header((ip, h.dst.port).into(), &mut written);
                    assert_eq!(
                        socks5::parse_udp(&written),
                        Ok((socks5::UdpHeader { frag: 0, dst: h.dst.clone() }, written.len()))
                    );
                }
            }
        }
    }
});
