//! Byte tables from RFC 2865 7.1 and 7.2, and the signatures checked both ways.

use super::*;

const SECRET: &[u8] = b"xyzzy5461";

/// RFC 2865 7.1: nemo's Access-Request (password "arctangent", NAS-IP-Address
/// 192.168.1.16, NAS-Port 3) ...
const RFC_REQUEST: [u8; 56] = [
    0x01, 0x00, 0x00, 0x38, 0x0f, 0x40, 0x3f, 0x94, 0x73, 0x97, 0x80, 0x57, 0xbd, 0x83, 0xd5, 0xcb,
    0x98, 0xf4, 0x22, 0x7a, 0x01, 0x06, 0x6e, 0x65, 0x6d, 0x6f, 0x02, 0x12, 0x0d, 0xbe, 0x70, 0x8d,
    0x93, 0xd4, 0x13, 0xce, 0x31, 0x96, 0xe4, 0x3f, 0x78, 0x2a, 0x0a, 0xee, 0x04, 0x06, 0xc0, 0xa8,
    0x01, 0x10, 0x05, 0x06, 0x00, 0x00, 0x00, 0x03,
];
/// ... and its Access-Accept (Service-Type Login, Login-Service Telnet, Login-IP-Host
/// 192.168.1.3).
const RFC_ACCEPT: [u8; 38] = [
    0x02, 0x00, 0x00, 0x26, 0x86, 0xfe, 0x22, 0x0e, 0x76, 0x24, 0xba, 0x2a, 0x10, 0x05, 0xf6, 0xbf,
    0x9b, 0x55, 0xe0, 0xb2, 0x06, 0x06, 0x00, 0x00, 0x00, 0x01, 0x0f, 0x06, 0x00, 0x00, 0x00, 0x00,
    0x0e, 0x06, 0xc0, 0xa8, 0x01, 0x03,
];
/// RFC 2865 7.2: flopsy's CHAP Access-Request (the Request Authenticator is the challenge).
const RFC_CHAP_REQUEST: [u8; 71] = [
    0x01, 0x01, 0x00, 0x47, 0x2a, 0xee, 0x86, 0xf0, 0x8d, 0x0d, 0x55, 0x96, 0x9c, 0xa5, 0x97, 0x8e,
    0x0d, 0x33, 0x67, 0xa2, 0x01, 0x08, 0x66, 0x6c, 0x6f, 0x70, 0x73, 0x79, 0x03, 0x13, 0x16, 0xe9,
    0x75, 0x57, 0xc3, 0x16, 0x18, 0x58, 0x95, 0xf2, 0x93, 0xff, 0x63, 0x44, 0x07, 0x72, 0x75, 0x04,
    0x06, 0xc0, 0xa8, 0x01, 0x10, 0x05, 0x06, 0x00, 0x00, 0x00, 0x14, 0x06, 0x06, 0x00, 0x00, 0x00,
    0x02, 0x07, 0x06, 0x00, 0x00, 0x00, 0x01,
];

fn rfc_authenticator(packet: &[u8]) -> [u8; 16] {
    packet[4..20].try_into().expect("16 bytes")
}

#[test]
fn the_rfc_access_request_is_written_byte_for_byte() {
    let mut b = Builder::new(ACCESS_REQUEST, 0, rfc_authenticator(&RFC_REQUEST));
    b.add(kind::USER_NAME, b"nemo").expect("add");
    b.add_password(b"arctangent", SECRET).expect("password");
    b.add(kind::NAS_IP_ADDRESS, &[192, 168, 1, 16]).expect("add");
    b.add_u32(5, 3).expect("add");
    assert_eq!(b.finish_access(SECRET), RFC_REQUEST);
}

#[test]
fn the_rfc_accept_is_checked_and_read() {
    let r = check_response(&RFC_ACCEPT, &RFC_REQUEST, SECRET).expect("authentic");
    assert_eq!(r.code, ACCESS_ACCEPT);
    let attrs: Vec<_> = r.attributes().collect();
    assert_eq!(
        attrs,
        [(6, &[0, 0, 0, 1][..]), (15, &[0, 0, 0, 0][..]), (14, &[192, 168, 1, 3][..])]
    );
    // Padding past the Length is ignored.
    let mut padded = RFC_ACCEPT.to_vec();
    padded.extend_from_slice(&[0; 7]);
    assert!(check_response(&padded, &RFC_REQUEST, SECRET).is_ok());
}

#[test]
fn forged_or_foreign_responses_are_refused() {
    assert_eq!(
        check_response(&RFC_ACCEPT, &RFC_REQUEST, b"another").expect_err("refused"),
        Error::BadAuthenticator
    );
    let mut changed = RFC_ACCEPT;
    changed[37] = 4; // Login-IP-Host 192.168.1.4
    assert_eq!(
        check_response(&changed, &RFC_REQUEST, SECRET).expect_err("refused"),
        Error::BadAuthenticator
    );
    let mut other = RFC_ACCEPT;
    other[1] = 9;
    assert_eq!(
        check_response(&other, &RFC_REQUEST, SECRET).expect_err("refused"),
        Error::OtherIdentifier(9)
    );
    assert!(matches!(
        check_response(&RFC_ACCEPT[..30], &RFC_REQUEST, SECRET),
        Err(Error::Malformed(30))
    ));
    let mut long = RFC_ACCEPT;
    long[3] = 0xff;
    assert!(matches!(check_response(&long, &RFC_REQUEST, SECRET), Err(Error::Malformed(_))));
}

#[test]
fn passwords_are_hidden_in_md5_chains() {
    let auth = rfc_authenticator(&RFC_REQUEST);
    // One block (the RFC's).
    assert_eq!(hide_password(b"arctangent", SECRET, &auth).expect("hide"), RFC_REQUEST[28..44]);
    // The empty password is one block of padding; 17 bytes take two blocks, the second
    // chained on the first hidden block.
    assert_eq!(hide_password(b"", SECRET, &auth).expect("hide").len(), 16);
    let two = hide_password(b"0123456789abcdefg", SECRET, &auth).expect("hide");
    assert_eq!(two.len(), 32);
    let b2 = Md5::new().chain_update(SECRET).chain_update(&two[..16]).finalize();
    assert_eq!(two[16] ^ b2[0], b'g');
    assert!(two[17..].iter().zip(&b2[1..]).all(|(c, k)| c ^ k == 0));
    assert_eq!(hide_password(&[b'x'; 128], SECRET, &auth).expect("hide").len(), 128);
    assert_eq!(hide_password(&[b'x'; 129], SECRET, &auth), Err(Error::PasswordTooLong));
}

#[test]
fn chap_answers_are_md5_of_ident_password_challenge() {
    // RFC 2865 7.2 does not give flopsy's password: the answer is checked by its
    // definition here and by FreeRADIUS in the backend's tests.
    let challenge = rfc_authenticator(&RFC_CHAP_REQUEST);
    let answer = chap_password(0x16, b"secret", &challenge);
    let expect =
        Md5::new().chain_update([0x16]).chain_update(b"secret").chain_update(challenge).finalize();
    assert_eq!(answer[0], 0x16);
    assert_eq!(answer[1..], expect[..]);
}

/// A server's response to `request`, as RFC 2865 3 and RFC 3579 3.2 have it signed.
fn respond(request: &[u8], code: u8, attrs: &[(u8, &[u8])], signed: bool) -> Vec<u8> {
    let mut b = Builder::new(code, request[1], rfc_authenticator(request));
    if signed {
        b.sign().expect("sign");
    }
    for (k, v) in attrs {
        b.add(*k, v).expect("add");
    }
    let mut p = b.finish_access(SECRET);
    let digest = Md5::new().chain_update(&p).chain_update(SECRET).finalize();
    p[4..20].copy_from_slice(&digest);
    p
}

#[test]
fn message_authenticators_are_signed_and_checked() {
    let mut b = Builder::new(ACCESS_REQUEST, 7, [3; 16]);
    b.sign().expect("sign");
    b.add(kind::USER_NAME, b"alice").expect("add");
    let request = b.finish_access(SECRET);
    // First attribute, HMAC-MD5 over the packet with its own zeroed.
    assert_eq!(&request[20..22], &[kind::MESSAGE_AUTHENTICATOR, 18]);
    let mut zeroed = request.clone();
    zeroed[22..38].fill(0);
    assert_eq!(hmac_md5(SECRET, &zeroed), request[22..38]);

    let good = respond(&request, ACCESS_ACCEPT, &[(kind::CLASS, b"gold")], true);
    let r = check_response(&good, &request, SECRET).expect("authentic");
    assert_eq!(r.attributes().last(), Some((kind::CLASS, &b"gold"[..])));
    // A signature of another secret, with the Response Authenticator recomputed: refused.
    let mut bad = good.clone();
    bad[22] ^= 1;
    let digest = Md5::new()
        .chain_update(&bad[..4])
        .chain_update(&request[4..20])
        .chain_update(&bad[20..])
        .chain_update(SECRET)
        .finalize();
    bad[4..20].copy_from_slice(&digest);
    assert_eq!(
        check_response(&bad, &request, SECRET).expect_err("refused"),
        Error::BadMessageAuthenticator
    );
    // Unsigned responses pass on their Response Authenticator alone.
    let plain = respond(&request, ACCESS_REJECT, &[], false);
    assert_eq!(check_response(&plain, &request, SECRET).expect("authentic").code, ACCESS_REJECT);
}

#[test]
fn accounting_requests_carry_their_md5_authenticator() {
    let mut b = Builder::new(ACCOUNTING_REQUEST, 2, [9; 16]);
    b.add_u32(kind::ACCT_STATUS_TYPE, 1).expect("add");
    b.add(kind::ACCT_SESSION_ID, b"s-1").expect("add");
    let p = b.finish_accounting(SECRET);
    assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, p.len());
    let mut zeroed = p.clone();
    zeroed[4..20].fill(0);
    let digest = Md5::new().chain_update(&zeroed).chain_update(SECRET).finalize();
    assert_eq!(p[4..20], digest[..]);
}

#[test]
fn attributes_are_bounded() {
    let mut b = Builder::new(ACCESS_REQUEST, 0, [0; 16]);
    assert_eq!(b.add(kind::USER_NAME, b""), Err(Error::BadValue));
    assert_eq!(b.add(kind::USER_NAME, &[b'a'; 254]), Err(Error::BadValue));
    for _ in 0..15 {
        b.add(kind::CLASS, &[b'c'; 253]).expect("fits");
    }
    assert_eq!(b.add(kind::CLASS, &[b'c'; 253]), Err(Error::TooLong));
}

#[test]
fn vendor_specific_values_split_into_sub_attributes() {
    let value = [0, 0, 0x37, 0x2a, 8, 6, 0, 0, 0x27, 0x10, 9, 3, b'x'];
    let subs: Vec<_> = vendor_attributes(&value).collect();
    assert_eq!(subs, [(14122, 8, &[0, 0, 0x27, 0x10][..]), (14122, 9, &b"x"[..])]);
    assert_eq!(vendor_attributes(&[0, 0, 1]).count(), 0);
    assert_eq!(vendor_attributes(&[0, 0, 0, 1, 5, 9, 1]).count(), 0);
}
