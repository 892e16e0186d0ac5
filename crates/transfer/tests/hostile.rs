//! Peers that do not play by the rules, against the real Source over real
//! sockets and TLS: connections that never authenticate, targets that stop
//! reading, more sessions than the limits, a first frame of a MiB, a
//! certificate of the cluster's CA that names no node.

mod common;

use common::*;
use lamina_transfer::wire::{self, Code, Frame, Mode, Request, PULL_VERSION};
use lamina_transfer::{describe, pull_into, Limits, Reason, SESSION_FRAMES};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A TCP connection to `addr` from the loopback address `ip` (each test
/// peer an address of its own, as the source counts handshakes per
/// address), sending nothing.
fn idle_from(ip: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind((ip, 0).into()).unwrap();
        s.connect(addr).await.unwrap().into_std().unwrap()
    });
    s.set_nonblocking(true).unwrap();
    s
}

/// Whether the source closed `s` (end of stream or reset), without waiting.
fn closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    match (&*s).read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// 64 MiB of data: far more than the frame buffers and the sockets between
/// the two sides hold, so that a target not reading stalls the stream.
fn big() -> (tempfile::TempDir, Arc<lamina_engine::Pool>) {
    source_pool(64 * MIB, &[(0, 64 * MIB as usize, 7)])
}

type Client = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A pull of the source's `src/s` by `client`'s node that, once answered,
/// reads nothing more.
fn stalled_pull(client: &mut Client) {
    write_frame(
        client,
        &Frame::Hello {
            version: PULL_VERSION,
        },
    );
    assert_eq!(
        read_frame(client),
        Frame::Hello {
            version: PULL_VERSION
        }
    );
    let r = Request {
        mode: Mode::Pull,
        expect_id: 0,
        from_offset: 0,
        volume: "src".into(),
        snapshot: "s".into(),
    };
    write_frame(client, &Frame::Request(r));
    assert!(matches!(read_frame(client), Frame::Answer(_)));
}

#[test]
fn idle_connections_beyond_the_handshake_limits_are_closed_and_a_peer_is_still_served() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let limits = Limits {
        handshakes: 16,
        handshakes_per_address: 4,
        // Held for the whole test: none times out on its own.
        opening_timeout: Duration::from_secs(600),
        ..Limits::default()
    };
    let served = Served::limited(src, src_id, None, limits);
    let source = &served.source;

    // Ten from one address: four are held, six closed at once.
    let first: Vec<TcpStream> = (0..10)
        .map(|_| idle_from(Ipv4Addr::new(127, 0, 0, 2), served.addr))
        .collect();
    eventually("six closed", || {
        source.turned_away() == 6 && first.iter().filter(|s| closed(s)).count() == 6
    });
    assert_eq!(source.connections(), 4);
    // A peer from another address is served meanwhile.
    let d = describe(&dst_id, &served.remote("source"), "src", "s").unwrap();
    assert_eq!(d.data_bytes, 4096);

    // Twelve more from three other addresses fill the sixteen.
    let mut more: Vec<TcpStream> = (3..6)
        .flat_map(|i| (0..4).map(move |_| Ipv4Addr::new(127, 0, 0, i)))
        .map(|ip| idle_from(ip, served.addr))
        .collect();
    eventually("sixteen held", || source.connections() == 16);
    assert_eq!(source.turned_away(), 6);
    // With all of them taken, the next one is closed, whatever its address.
    let late = idle_from(Ipv4Addr::new(127, 0, 0, 6), served.addr);
    eventually("the seventeenth closed", || {
        source.turned_away() == 7 && closed(&late)
    });
    // Idle ones that go give their places back to a peer.
    more.truncate(8);
    eventually("twelve held", || source.connections() == 12);
    describe(&dst_id, &served.remote("source"), "src", "s").unwrap();
    drop(first);
}

#[test]
fn a_target_that_stops_reading_is_cut_off_and_its_connection_closed() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = big();
    let limits = Limits {
        stall_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let served = Served::limited(src, src_id, None, limits);
    let mut c = fake_client(&dst_id, served.addr, "source");
    stalled_pull(&mut c);
    assert_eq!(
        served.source.readers("src", "s"),
        vec!["target".to_string()]
    );
    // The client holds its end open and reads nothing: the source lets the
    // snapshot go and closes the connection on its side.
    eventually("the stalled session closed", || {
        served.source.connections() == 0
    });
    assert!(served.source.readers("src", "s").is_empty());
    assert_eq!(served.source.frame_buffers(), 0);
    drop(c);
}

#[test]
fn sessions_beyond_the_limits_are_refused_as_busy_and_the_puller_says_why() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_o, other_id) = ca.identity("other");
    let (_h, third_id) = ca.identity("third");
    let (_a, src) = big();
    let limits = Limits {
        sessions: 2,
        sessions_per_peer: 1,
        stall_timeout: Duration::from_secs(600),
        ..Limits::default()
    };
    let served = Served::limited(src, src_id, None, limits);
    let remote = served.remote("source");
    let mut held = fake_client(&dst_id, served.addr, "source");
    stalled_pull(&mut held);

    // The same peer again: over its limit.
    let (_b, dst) = pool();
    dst.create_volume("copy", 64 * MIB).unwrap();
    let e = pull_into(
        &dst,
        &dst_id,
        &fresh("copy", &remote, "src", "s", MIB),
        &mut Nothing,
    )
    .end
    .unwrap_err();
    assert_eq!(e.reason(), Reason::SourceUnreachable, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("Busy") && msg.contains("sessions of node target") && msg.contains("per peer"),
        "{msg}"
    );
    assert_eq!(dst.volume_info_by_name("copy").unwrap().allocated_bytes, 0);
    // Another peer has room.
    describe(&other_id, &remote, "src", "s").unwrap();
    let mut held2 = fake_client(&other_id, served.addr, "source");
    stalled_pull(&mut held2);
    // Now all are taken.
    let e = describe(&third_id, &remote, "src", "s").unwrap_err();
    assert_eq!(e.reason(), Reason::SourceUnreachable, "{e}");
    assert!(e.to_string().contains("holds 2 sessions, its limit"), "{e}");
    assert_eq!(served.source.busy(), 2);
    // A session that ends gives its place back.
    drop(held);
    eventually("the first session gone", || {
        served.source.connections() == 1
    });
    describe(&third_id, &remote, "src", "s").unwrap();
    drop(held2);
}

#[test]
fn a_stalled_session_holds_a_bounded_number_of_frame_buffers() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = big();
    let served = Served::new(src, src_id);
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = fake_client(&dst_id, served.addr, "source");
        stalled_pull(&mut c);
        clients.push(c);
    }
    // Each stream fills what its session may hold, and no more: polled
    // until all are full, never above.
    let bound = 3 * SESSION_FRAMES;
    let t = Instant::now();
    loop {
        let n = served.source.frame_buffers();
        assert!(n <= bound, "{n} frame buffers held, at most {bound}");
        if n == bound {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{n} frame buffers, never {bound}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(clients);
    eventually("the buffers freed", || served.source.frame_buffers() == 0);
}

#[test]
fn a_megabyte_sent_in_place_of_hello_is_refused_in_a_short_line() {
    capture_logs();
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let mut c = fake_client(&dst_id, served.addr, "source");
    let mut frame = Vec::new();
    wire::encode_data(0, &vec![0; wire::MAX_DATA], &mut frame);
    c.write_all(&frame).unwrap();
    c.flush().unwrap();
    match read_frame(&mut c) {
        Frame::Error { code, message } => {
            assert_eq!(code, Code::BadRequest, "{message}");
            assert_eq!(message, "expected Hello, got Data at 0 (1048576 bytes)");
        }
        f => panic!("expected an Error frame, got {}", f.summary()),
    }
    eventually("the refusal logged", || {
        logs().contains("expected Hello, got Data at 0")
    });
    let logs = logs();
    let longest = logs.lines().map(str::len).max().unwrap_or(0);
    assert!(longest <= 1024, "a log line of {longest} bytes");
}

#[test]
fn a_certificate_of_the_ca_naming_no_node_is_refused() {
    capture_logs();
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);

    // Signed by the cluster's CA, for client authentication, with a common
    // name but no DNS subjectAltName.
    let ca_dir = ca.0.path();
    let ca_key = rcgen::KeyPair::from_pem(
        &std::fs::read_to_string(ca_dir.join(lamina_transfer::certs::CA_KEY_FILE)).unwrap(),
    )
    .unwrap();
    let ca_pem = std::fs::read_to_string(ca_dir.join(lamina_transfer::CA_FILE)).unwrap();
    let ca_cert = rcgen::CertificateParams::from_ca_cert_pem(&ca_pem)
        .unwrap()
        .self_signed(&ca_key)
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "nameless");
    p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key_der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert.der().clone()], key_der)
        .unwrap();
    let tcp = TcpStream::connect(served.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("source").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut c = rustls::StreamOwned::new(conn, tcp);
    // TLS 1.3: the client's side of the handshake ends before the source
    // has looked at its certificate; the refusal comes as an alert.
    write_frame(
        &mut c,
        &Frame::Hello {
            version: PULL_VERSION,
        },
    );
    let mut b = [0u8; 64];
    let got = c.read(&mut b);
    assert!(
        matches!(got, Err(ref e) if format!("{e:?}").contains("AlertReceived(CertificateUnknown)")),
        "the source answered a peer naming no node: {got:?}"
    );
    eventually("the refusal counted", || served.source.refused() == 1);
    assert_eq!(served.source.connections(), 0);
    assert!(logs().contains("names no node"), "{}", logs());
}
