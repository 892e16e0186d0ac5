//! Authentication, versions, and a fake source that breaks the protocol.

mod common;

use common::*;
use lamina_transfer::wire::{Answer, Code, Frame, Mode, Request, ORIGIN_VERSION, PULL_VERSION};
use lamina_transfer::{describe, Reason, Remote};

#[test]
fn a_client_from_another_ca_is_refused_and_logged() {
    capture_logs();
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let (_t, stranger) = Ca::new().identity("stranger");
    let e = describe(&stranger, &served.remote("source"), "src", "s").unwrap_err();
    assert_eq!(e.reason(), Reason::Refused, "{e}");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    // Neither trusts the other's CA: the client's verification fails
    // first and aborts the handshake; the source logs the failed one.
    eventually("the source counted the refusal", || {
        served.source.refused() == 1
    });
    assert!(logs().contains("refused a peer"), "{}", logs());
}

#[test]
fn a_client_certificate_the_source_does_not_trust_is_refused() {
    // The client trusts the source's CA, but its own certificate comes from
    // another CA: the source refuses it during the handshake.
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let other = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    lamina_transfer::certs::issue(other.0.path(), "intruder", dir.path()).unwrap();
    // Swap in the cluster's CA as the one it verifies servers against.
    std::fs::copy(ca.0.path().join("ca.crt"), dir.path().join("ca.crt")).unwrap();
    // Its certificate does not chain to its ca.crt: loading does not check
    // that; the source's verification refuses it.
    let intruder = lamina_transfer::Identity::load(dir.path()).unwrap();
    let e = describe(&intruder, &served.remote("source"), "src", "s").unwrap_err();
    assert_eq!(e.reason(), Reason::Refused, "{e}");
    assert!(e.to_string().contains("UnknownCA"), "{e}");
    eventually("the source counted the refusal", || {
        served.source.refused() == 1
    });
}

#[test]
fn a_source_with_another_name_is_refused() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let e = describe(&dst_id, &served.remote("other-node"), "src", "s").unwrap_err();
    assert_eq!(e.reason(), Reason::Refused, "{e}");
    assert!(e.to_string().contains("other-node"), "{e}");
    eventually("the source counted the refusal", || {
        served.source.refused() == 1
    });
}

#[test]
fn a_client_of_another_version_gets_a_clear_error() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let mut c = fake_client(&dst_id, served.addr, "source");
    write_frame(&mut c, &Frame::Hello { version: 99 });
    match read_frame(&mut c) {
        Frame::Error { code, message } => {
            assert_eq!(code, Code::Version);
            assert!(
                message.contains("version 1") && message.contains("99"),
                "{message}"
            );
        }
        f => panic!("expected an Error frame, got {f:?}"),
    }
}

#[test]
fn a_source_of_another_version_gets_a_clear_error() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (addr, fake) = fake_source(src_id, |s| {
        assert_eq!(
            read_frame(s),
            Frame::Hello {
                version: ORIGIN_VERSION
            }
        );
        write_frame(s, &Frame::Hello { version: 2 });
    });
    let remote = Remote {
        address: addr.to_string(),
        node: "source".into(),
    };
    let e = describe(&dst_id, &remote, "src", "s").unwrap_err();
    fake.join().unwrap();
    assert_eq!(e.reason(), Reason::Protocol, "{e}");
    assert!(
        e.to_string().contains("version 2, this node asked for 3"),
        "{e}"
    );
}

#[test]
fn a_source_of_version_1_or_2_is_asked_again_in_version_1_and_names_no_holders() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (addr, fake) = fake_sources(src_id, 2, |i, s| match i {
        // An older source refuses version 3 and closes.
        0 => {
            assert_eq!(
                read_frame(s),
                Frame::Hello {
                    version: ORIGIN_VERSION
                }
            );
            write_frame(
                s,
                &Frame::Error {
                    code: Code::Version,
                    message:
                        "this source speaks transfer protocol version 1 or 2, the peer version 3"
                            .into(),
                },
            );
        }
        _ => {
            assert_eq!(
                read_frame(s),
                Frame::Hello {
                    version: PULL_VERSION
                }
            );
            write_frame(
                s,
                &Frame::Hello {
                    version: PULL_VERSION,
                },
            );
            assert!(matches!(read_frame(s), Frame::Request(_)));
            let a = Answer {
                id: 7,
                size: MIB,
                data_bytes: 0,
                skipped_bytes: 0,
                holders: Vec::new(),
            };
            write_frame(s, &Frame::Answer(a));
            write_frame(
                s,
                &Frame::End {
                    frames: 0,
                    data_bytes: 0,
                },
            );
        }
    });
    let remote = Remote {
        address: addr.to_string(),
        node: "source".into(),
    };
    let d = describe(&dst_id, &remote, "src", "s").unwrap();
    fake.join().unwrap();
    assert_eq!((d.id, d.size, d.holders.len()), (7, MIB, 0));
}

#[test]
fn a_frame_with_a_bad_checksum_fails_the_pull_and_is_not_applied() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (addr, fake) = fake_source(src_id, |s| {
        assert_eq!(
            read_frame(s),
            Frame::Hello {
                version: ORIGIN_VERSION
            }
        );
        write_frame(
            s,
            &Frame::Hello {
                version: ORIGIN_VERSION,
            },
        );
        let Frame::Request(r) = read_frame(s) else {
            panic!("no request")
        };
        assert_eq!(
            r,
            Request {
                mode: Mode::Pull,
                expect_id: 7,
                from_offset: 0,
                volume: "src".into(),
                snapshot: "s".into()
            }
        );
        let a = Answer {
            id: 7,
            size: 4 * MIB,
            data_bytes: 8192,
            skipped_bytes: 0,
            holders: Vec::new(),
        };
        write_frame(s, &Frame::Answer(a));
        write_frame(
            s,
            &Frame::Data {
                offset: 0,
                payload: vec![1; 4096],
            },
        );
        let mut bad = Vec::new();
        lamina_transfer::wire::encode_data(4096, &[2; 4096], &mut bad);
        bad[100] ^= 0x40; // a payload bit flips on the way
        std::io::Write::write_all(s, &bad).unwrap();
        std::io::Write::flush(s).unwrap();
        // The target stops reading: end when it closes.
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(s, &mut rest);
    });
    let (_b, dst) = pool();
    dst.create_volume("copy", 4 * MIB).unwrap();
    let remote = Remote {
        address: addr.to_string(),
        node: "source".into(),
    };
    let e = pull_copy(&dst, &dst_id, &remote, 7, 0, &mut Nothing)
        .end
        .unwrap_err();
    fake.join().unwrap();
    assert_eq!(e.reason(), Reason::Checksum, "{e}");
    assert!(e.to_string().contains("at offset 4096"), "{e}");
    // The good frame was applied, nothing of the bad one.
    let got = read_all(&dst, "copy", None);
    assert!(got[..4096].iter().all(|&b| b == 1));
    assert!(got[4096..].iter().all(|&b| b == 0));
}

#[test]
fn a_fake_source_sending_outside_the_snapshot_is_a_protocol_error() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (addr, fake) = fake_source(src_id, |s| {
        read_frame(s);
        write_frame(
            s,
            &Frame::Hello {
                version: ORIGIN_VERSION,
            },
        );
        read_frame(s);
        let a = Answer {
            id: 7,
            size: MIB,
            data_bytes: 4096,
            skipped_bytes: 0,
            holders: Vec::new(),
        };
        write_frame(s, &Frame::Answer(a));
        write_frame(
            s,
            &Frame::Data {
                offset: MIB,
                payload: vec![1; 4096],
            },
        );
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(s, &mut rest);
    });
    let (_b, dst) = pool();
    dst.create_volume("copy", 4 * MIB).unwrap();
    let remote = Remote {
        address: addr.to_string(),
        node: "source".into(),
    };
    let e = pull_copy(&dst, &dst_id, &remote, 0, 0, &mut Nothing)
        .end
        .unwrap_err();
    fake.join().unwrap();
    assert_eq!(e.reason(), Reason::Protocol, "{e}");
    assert_eq!(dst.volume_info_by_name("copy").unwrap().allocated_bytes, 0);
}

#[test]
fn a_client_breaking_the_protocol_gets_a_bad_request() {
    let ca = Ca::new();
    let (_s, src_id) = ca.identity("source");
    let (_t, dst_id) = ca.identity("target");
    let (_a, src) = source_pool(4 * MIB, &[(0, 4096, 1)]);
    let served = Served::new(src, src_id);
    let bad_requests = [
        Frame::Data {
            offset: 0,
            payload: vec![1],
        },
        Frame::Request(Request {
            mode: Mode::Pull,
            expect_id: 0,
            from_offset: 0,
            volume: "../etc".into(),
            snapshot: "s".into(),
        }),
    ];
    for f in bad_requests {
        let mut c = fake_client(&dst_id, served.addr, "source");
        write_frame(
            &mut c,
            &Frame::Hello {
                version: PULL_VERSION,
            },
        );
        assert_eq!(
            read_frame(&mut c),
            Frame::Hello {
                version: PULL_VERSION
            }
        );
        write_frame(&mut c, &f);
        match read_frame(&mut c) {
            Frame::Error { code, message } => {
                assert_eq!(code, Code::BadRequest, "{message}");
                assert!(!message.is_empty());
            }
            g => panic!("expected an Error frame for {f:?}, got {g:?}"),
        }
    }
}
