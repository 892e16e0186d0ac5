use super::*;
use lamina_blockio::IoErrorKind;
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9._-]{0,40}"
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        any::<u16>().prop_map(|version| Frame::Hello { version }),
        (any::<bool>(), any::<u64>(), any::<u64>(), name(), name()).prop_map(
            |(d, expect_id, from_offset, volume, snapshot)| Frame::Request(Request {
                mode: if d { Mode::Describe } else { Mode::Pull },
                expect_id,
                from_offset,
                volume,
                snapshot,
            })
        ),
        (
            any::<[u64; 4]>(),
            proptest::collection::vec((name(), name()), 0..=MAX_HOLDERS)
        )
            .prop_map(|([id, size, data_bytes, skipped_bytes], h)| {
                Frame::Answer(Answer {
                    id,
                    size,
                    data_bytes,
                    skipped_bytes,
                    holders: h
                        .into_iter()
                        .map(|(node, address)| Holder { node, address })
                        .collect(),
                })
            }),
        (
            0u64..1 << 50,
            proptest::collection::vec(any::<u8>(), 1..5000)
        )
            .prop_map(|(offset, payload)| Frame::Data { offset, payload }),
        (0u64..1 << 50, 1u64..1 << 40).prop_map(|(offset, len)| Frame::Zero { offset, len }),
        any::<[u64; 2]>().prop_map(|[frames, data_bytes]| Frame::End { frames, data_bytes }),
        (any::<u16>(), ".{0,100}").prop_map(|(c, message)| Frame::Error {
            code: Code::from_u16(c),
            message
        }),
        (any::<u64>(), name()).prop_map(|(create, volume)| Frame::Attach { create, volume }),
        (
            any::<u64>(),
            0u8..32,
            any::<bool>(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(size, caps, read_only, instance)| Frame::Attached {
                size,
                caps: super::calls::caps_of(caps),
                read_only,
                instance,
            }),
        (any::<u64>(), call_op()).prop_map(|(tag, op)| Frame::Call(Call { tag, op })),
        (any::<u64>(), outcome()).prop_map(|(tag, outcome)| Frame::Reply(Reply { tag, outcome })),
        (any::<bool>(), name()).prop_map(|(check, volume)| Frame::Retire { check, volume }),
        any::<bool>().prop_map(|existed| Frame::Retired { existed }),
    ]
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0u64..1 << 50, 1u64..1 << 40)
}

fn call_op() -> impl Strategy<Value = CallOp> {
    prop_oneof![
        (0u64..1 << 50, 1u64..=MAX_DATA as u64)
            .prop_map(|(offset, len)| CallOp::Read { offset, len }),
        (
            0u64..1 << 50,
            proptest::collection::vec(any::<u8>(), 1..3000),
            any::<bool>()
        )
            .prop_map(|(offset, data, fua)| CallOp::Write { offset, data, fua }),
        Just(CallOp::Flush),
        range().prop_map(|(offset, len)| CallOp::Trim { offset, len }),
        (range(), any::<bool>()).prop_map(|((offset, len), may_trim)| CallOp::WriteZeroes {
            offset,
            len,
            may_trim
        }),
        range().prop_map(|(offset, len)| CallOp::BlockStatus { offset, len }),
        any::<u64>().prop_map(|generation| CallOp::Activate { generation }),
        Just(CallOp::Size),
        Just(CallOp::Ping),
        (name(), any::<u64>(), any::<bool>()).prop_map(|(name, origin, group)| CallOp::Snapshot {
            name,
            origin,
            group
        }),
        name().prop_map(|name| CallOp::DeleteSnapshot { name }),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    let extent = (1u64..1 << 40, any::<bool>(), any::<bool>())
        .prop_map(|(length, hole, zero)| lamina_blockio::Extent { length, hole, zero });
    let kinds = [
        IoErrorKind::Io,
        IoErrorKind::NoSpace,
        IoErrorKind::Invalid,
        IoErrorKind::ReadOnly,
        IoErrorKind::NotSupported,
        IoErrorKind::Gone,
        IoErrorKind::Fenced,
    ];
    let ops = [
        OpCode::Read,
        OpCode::Write,
        OpCode::Flush,
        OpCode::Trim,
        OpCode::WriteZeroes,
        OpCode::BlockStatus,
        OpCode::Activate,
        OpCode::Size,
        OpCode::Ping,
        OpCode::Snapshot,
        OpCode::DeleteSnapshot,
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 1..3000)
            .prop_map(|d| Outcome::Done(Answered::Read(d))),
        proptest::collection::vec(extent, 1..50)
            .prop_map(|e| Outcome::Done(Answered::BlockStatus(e))),
        any::<u64>().prop_map(|s| Outcome::Done(Answered::Size(s))),
        proptest::sample::select(vec![
            Answered::Write,
            Answered::Flush,
            Answered::Trim,
            Answered::WriteZeroes,
            Answered::Activate,
            Answered::Ping,
            Answered::Snapshot,
            Answered::DeleteSnapshot,
        ])
        .prop_map(Outcome::Done),
        (
            proptest::sample::select(ops.to_vec()),
            proptest::sample::select(kinds.to_vec()),
            ".{0,100}"
        )
            .prop_map(|(op, kind, message)| Outcome::Failed { op, kind, message }),
    ]
}

proptest! {
    #[test]
    fn encode_then_decode_is_the_same_frame(f in frame(), junk in proptest::collection::vec(any::<u8>(), 0..16)) {
        let mut buf = Vec::new();
        encode(&f, &mut buf);
        let n = buf.len();
        buf.extend_from_slice(&junk);
        prop_assert_eq!(decode(&buf).unwrap(), Some((f.clone(), n)));
        // Every strict prefix asks for more bytes.
        for cut in [0, 1, HEADER - 1, HEADER, n / 2, n - 1] {
            prop_assert_eq!(decode(&buf[..cut]).unwrap(), None);
        }
        if let Frame::Data { offset, payload } = &f {
            let mut other = Vec::new();
            encode_data(*offset, payload, &mut other);
            prop_assert_eq!(&other[..], &buf[..n]);
        }
    }

    #[test]
    fn any_bytes_decode_to_a_frame_or_an_error(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode(&buf);
    }

    #[test]
    fn any_checksummed_body_decodes_to_a_frame_or_an_error(
        kind in 0u8..15,
        body in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        // A valid header and checksum around random bytes: the body parsers
        // see it all.
        let buf = super::framed(kind, &body);
        if let Ok(Some((f, n))) = decode(&buf) {
            prop_assert_eq!(n, buf.len());
            let mut again = Vec::new();
            encode(&f, &mut again);
            prop_assert_eq!(again, buf, "a decoded frame encodes to the same bytes");
        }
    }

    #[test]
    fn a_flipped_bit_is_caught(f in frame(), bit in any::<usize>()) {
        let mut buf = Vec::new();
        encode(&f, &mut buf);
        let bit = bit % (buf.len() * 8);
        buf[bit / 8] ^= 1 << (bit % 8);
        // Either the header no longer parses, the frame looks incomplete
        // (its length grew), or it fails: never the same frame.
        if let Ok(Some((g, _))) = decode(&buf) {
            prop_assert_ne!(g, f);
        }
    }
}

#[test]
fn a_bad_checksum_names_the_offset() {
    let mut buf = Vec::new();
    encode_data(12288, &[5; 100], &mut buf);
    let last = buf.len() - 1;
    buf[last] ^= 1;
    assert_eq!(
        decode(&buf),
        Err(WireError::Checksum {
            kind: Kind::Data,
            offset: Some(12288)
        })
    );
    assert!(decode(&buf)
        .unwrap_err()
        .to_string()
        .contains("at offset 12288"));
}

#[test]
fn lengths_are_bounded_before_reading_the_body() {
    let h = [Kind::Data as u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
    assert!(matches!(check_header(&h), Err(WireError::TooLong { .. })));
    let mut h = [Kind::Data as u8, 0, 0, 0, 0, 0, 0, 0];
    h[4..].copy_from_slice(&((8 + MAX_DATA) as u32).to_be_bytes());
    assert_eq!(check_header(&h), Ok((Kind::Data, 8 + MAX_DATA + TRAILER)));
    assert_eq!(
        check_header(&[14, 0, 0, 0, 0, 0, 0, 0]),
        Err(WireError::UnknownKind(14))
    );
    assert_eq!(
        check_header(&[1, 0, 1, 0, 0, 0, 0, 0]),
        Err(WireError::Reserved)
    );
}

#[test]
fn a_hello_without_the_magic_is_refused() {
    let mut buf = Vec::new();
    encode(&Frame::Hello { version: 1 }, &mut buf);
    buf[HEADER] = b'X';
    let sum = crc32c::crc32c(&buf[..buf.len() - TRAILER]);
    let n = buf.len();
    buf[n - TRAILER..].copy_from_slice(&sum.to_be_bytes());
    let e = decode(&buf).unwrap_err().to_string();
    assert!(e.contains("wrong magic"), "{e}");
}

proptest! {
    /// What a log line or an error message shows of a peer's frame stays
    /// short, whatever the frame holds.
    #[test]
    fn a_summary_is_short_whatever_the_frame_holds(
        f in frame(),
        name in "\\PC{0,255}",
        message in "(.|\\PC){0,4096}",
    ) {
        let request = Frame::Request(Request {
            mode: Mode::Pull,
            expect_id: 0,
            from_offset: u64::MAX,
            volume: name.clone(),
            snapshot: name,
        });
        let error = Frame::Error { code: Code::Other(u16::MAX), message };
        for f in [f, request, error] {
            let s = f.summary();
            prop_assert!(s.len() <= 512, "{} bytes: {s}", s.len());
        }
    }
}

#[test]
fn a_megabyte_of_payload_is_summarized_by_its_length() {
    let f = Frame::Data {
        offset: 4096,
        payload: vec![0; MAX_DATA],
    };
    assert_eq!(f.summary(), "Data at 4096 (1048576 bytes)");
    let e = Frame::Error {
        code: Code::Busy,
        message: "x".repeat(MAX_MESSAGE),
    };
    let s = e.summary();
    assert!(
        s.starts_with("Error (Busy: \"xxx") && s.ends_with("...)"),
        "{s}"
    );
}

#[test]
fn a_call_is_checked_field_by_field() {
    let body = |tag: u64, op: u8, flags: u8, offset: u64, len: u64, payload: &[u8]| {
        let mut b = tag.to_be_bytes().to_vec();
        b.push(op);
        b.push(flags);
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(payload);
        super::framed(Kind::Call as u8, &b)
    };
    let bad = |buf: Vec<u8>, want: &str| {
        let e = decode(&buf).unwrap_err().to_string();
        assert!(e.contains(want), "{e} (wanted {want:?})");
    };
    bad(body(1, 11, 0, 0, 0, &[]), "unknown op 11");
    bad(body(1, 10, 0, 0, 0, &[]), "a name of 0 bytes");
    bad(body(1, 9, 0, 0, 0, &[]), "a name of 0 bytes");
    bad(body(1, 9, 0, 0, 3, b"ab"), "len 3 and a name of 2 bytes");
    bad(body(1, 9, 0, 0, 256, &[b'a'; 256]), "a name of 256 bytes");
    bad(body(1, 9, 0, 0, 1, &[0xff]), "not UTF-8");
    bad(body(1, 0, 1, 0, 4096, &[]), "flags 0x01 on a Read call");
    bad(body(1, 0, 0, 0, MAX_DATA as u64 + 1, &[]), "more than");
    bad(body(1, 0, 0, 0, 0, &[]), "bad range");
    bad(body(1, 0, 0, 0, 4096, &[1]), "after the last field");
    bad(body(1, 1, 0, 0, 2, &[1]), "announces 2 bytes and carries 1");
    bad(body(1, 1, 4, 0, 1, &[1]), "flags 0x04");
    bad(body(1, 3, 0, u64::MAX, 2, &[]), "bad range");
    bad(body(1, 2, 0, 5, 0, &[]), "flush call with offset 5");
    bad(body(1, 6, 0, 5, 1, &[]), "activate call with len 1");
    assert_eq!(
        decode(&body(7, 1, FLAG_FUA, 4096, 3, &[1, 2, 3]))
            .unwrap()
            .unwrap()
            .0,
        Frame::Call(Call {
            tag: 7,
            op: CallOp::Write {
                offset: 4096,
                data: vec![1, 2, 3],
                fua: true
            }
        })
    );
    assert_eq!(
        decode(&body(8, 6, 0, 42, 0, &[])).unwrap().unwrap().0,
        Frame::Call(Call {
            tag: 8,
            op: CallOp::Activate { generation: 42 }
        })
    );
    // The fast encoder gives what encode gives.
    let mut fast = Vec::new();
    encode_call(7, OpCode::Write, FLAG_FUA, 4096, 3, &[1, 2, 3], &mut fast);
    assert_eq!(fast, body(7, 1, FLAG_FUA, 4096, 3, &[1, 2, 3]));
}

#[test]
fn a_reply_is_checked_field_by_field() {
    let reply = |op: u8, status: u8, rest: &[u8]| {
        let mut b = 5u64.to_be_bytes().to_vec();
        b.push(op);
        b.push(status);
        b.extend_from_slice(rest);
        super::framed(Kind::Reply as u8, &b)
    };
    let bad = |buf: Vec<u8>, want: &str| {
        let e = decode(&buf).unwrap_err().to_string();
        assert!(e.contains(want), "{e} (wanted {want:?})");
    };
    bad(reply(0, 8, b"x"), "unknown status 8");
    bad(reply(0, 0, &[]), "read reply without data");
    bad(reply(5, 0, &[0; 8]), "8 bytes of extents");
    bad(reply(5, 0, &[0; 9]), "extent of 0 bytes");
    let mut flags4 = 1u64.to_be_bytes().to_vec();
    flags4.push(4);
    bad(reply(5, 0, &flags4), "flags 0x04");
    bad(reply(7, 0, &[0; 4]), "body ends inside size");
    bad(reply(1, 0, &[0]), "after the last field");
    bad(reply(1, 3, &[0xff]), "not UTF-8");
    assert_eq!(
        decode(&reply(1, 7, b"held at 9")).unwrap().unwrap().0,
        Frame::Reply(Reply {
            tag: 5,
            outcome: Outcome::Failed {
                op: OpCode::Write,
                kind: IoErrorKind::Fenced,
                message: "held at 9".into()
            }
        })
    );
}

#[test]
fn version_3_frames_are_laid_out_as_documented() {
    fn name(s: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(&(s.len() as u16).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    // An Answer: four u64, the count, then each holder's node and address.
    let mut body = Vec::new();
    for v in [0x1234_abcd_5678_ef01u64, 384 << 20, 192 << 20, 64 << 20] {
        body.extend_from_slice(&v.to_be_bytes());
    }
    body.push(2);
    for s in ["n1", "10.0.0.2:7401", "n2", "10.0.0.3:7401"] {
        name(s, &mut body);
    }
    let a = Answer {
        id: 0x1234_abcd_5678_ef01,
        size: 384 << 20,
        data_bytes: 192 << 20,
        skipped_bytes: 64 << 20,
        holders: vec![
            Holder {
                node: "n1".into(),
                address: "10.0.0.2:7401".into(),
            },
            Holder {
                node: "n2".into(),
                address: "10.0.0.3:7401".into(),
            },
        ],
    };
    let mut out = Vec::new();
    encode(&Frame::Answer(a.clone()), &mut out);
    assert_eq!(out, framed(3, &body));
    assert_eq!(decode(&out).unwrap(), Some((Frame::Answer(a), out.len())));
    // Without holders, the Answer of versions 1 and 2: 32 bytes.
    assert_eq!(decode(&framed(3, &body[..32])).unwrap().unwrap().1, 44);
    // A count of 0, of 5, a holder cut short, an empty node: malformed.
    for bad in [
        [&body[..32], &[0]].concat(),
        [&body[..32], &[5]].concat(),
        body[..body.len() - 1].to_vec(),
        [&body[..32], &[1, 0, 0, 0, 1, b'x']].concat(),
    ] {
        assert!(
            matches!(decode(&framed(3, &bad)), Err(WireError::Malformed { .. })),
            "{bad:?}"
        );
    }
    // A snapshot Call: its origin in the offset; a delete takes none.
    let mut body = Vec::new();
    body.extend_from_slice(&7u64.to_be_bytes());
    body.extend_from_slice(&[9, 0]);
    body.extend_from_slice(&0x1234_abcd_5678_ef01u64.to_be_bytes());
    body.extend_from_slice(&4u64.to_be_bytes());
    body.extend_from_slice(b"gold");
    let c = Call {
        tag: 7,
        op: CallOp::Snapshot {
            name: "gold".into(),
            origin: 0x1234_abcd_5678_ef01,
            group: false,
        },
    };
    let mut out = Vec::new();
    encode(&Frame::Call(c.clone()), &mut out);
    assert_eq!(out, framed(10, &body));
    assert_eq!(decode(&out).unwrap(), Some((Frame::Call(c), out.len())));
    // Version 6: a member of group snapshot "gold", flag bit 2.
    body[9] = 4;
    let g = Call {
        tag: 7,
        op: CallOp::Snapshot {
            name: "gold".into(),
            origin: 0x1234_abcd_5678_ef01,
            group: true,
        },
    };
    let mut out = Vec::new();
    encode(&Frame::Call(g.clone()), &mut out);
    assert_eq!(out, framed(10, &body));
    assert_eq!(decode(&out).unwrap(), Some((Frame::Call(g), out.len())));
    // Any other flag is malformed.
    for flags in [1, 2, 8, 0x80] {
        body[9] = flags;
        assert!(matches!(
            decode(&framed(10, &body)),
            Err(WireError::Malformed { .. })
        ));
    }
    body[9] = 0;
    body[8] = 10;
    assert!(matches!(
        decode(&framed(10, &body)),
        Err(WireError::Malformed { .. })
    ));
}

#[test]
fn version_4_frames_are_laid_out_as_documented() {
    // A Retire: mode (0 delete, 1 check), then the volume's name.
    let f = Frame::Retire {
        check: false,
        volume: "data".into(),
    };
    let mut out = Vec::new();
    encode(&f, &mut out);
    assert_eq!(out, framed(12, &[0, 0, 4, b'd', b'a', b't', b'a']));
    assert_eq!(decode(&out).unwrap(), Some((f, out.len())));
    assert_eq!(
        decode(&framed(12, &[1, 0, 1, b'v'])).unwrap().unwrap().0,
        Frame::Retire {
            check: true,
            volume: "v".into()
        }
    );
    // A Retired: whether the volume was there.
    let mut out = Vec::new();
    encode(&Frame::Retired { existed: true }, &mut out);
    assert_eq!(out, framed(13, &[1]));
    // Another mode, an empty or cut name, a name too long, an existed of
    // 2, bytes after the last field: malformed.
    let long = [&[0u8, 1, 0][..], &[b'x'; 256]].concat();
    for (kind, bad) in [
        (12, vec![2, 0, 1, b'v']),
        (12, vec![0, 0, 0]),
        (12, vec![0, 0, 2, b'v']),
        (12, vec![0, 0, 1, b'v', 0]),
        (13, vec![2]),
        (13, vec![]),
    ] {
        assert!(
            matches!(
                decode(&framed(kind, &bad)),
                Err(WireError::Malformed { .. })
            ),
            "{kind}: {bad:?}"
        );
    }
    // Limits, checked on the header before the body is read: a Retire of
    // 258 bytes, a Retired of 1.
    assert!(matches!(
        decode(&framed(12, &long)),
        Err(WireError::TooLong {
            len: 259,
            max: 258,
            ..
        })
    ));
    assert!(matches!(
        check_header(&[13, 0, 0, 0, 0, 0, 0, 2]),
        Err(WireError::TooLong { len: 2, max: 1, .. })
    ));
    // Code 10: not a replica of the asking node's.
    assert_eq!(Code::from_u16(10), Code::NotReplica);
    assert_eq!(Code::NotReplica.to_u16(), 10);
}

#[test]
fn version_5_frames_are_laid_out_as_documented() {
    // An Attached with the node's instance: size, caps, read_only, then
    // the instance; without it, the version 2 body.
    let caps = super::calls::caps_of(0x1f);
    let f = Frame::Attached {
        size: 1 << 20,
        caps,
        read_only: false,
        instance: Some(0x0102_0304_0506_0708),
    };
    let mut out = Vec::new();
    encode(&f, &mut out);
    let body = [0, 0, 0, 0, 0, 0x10, 0, 0, 0x1f, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    assert_eq!(out, framed(9, &body));
    assert_eq!(decode(&out).unwrap(), Some((f, out.len())));
    assert_eq!(
        decode(&framed(9, &body[..10])).unwrap().unwrap().0,
        Frame::Attached {
            size: 1 << 20,
            caps,
            read_only: false,
            instance: None,
        }
    );
    // An instance cut short: malformed; one byte more than the instance:
    // too long, on the header.
    for cut in 11..18 {
        assert!(
            matches!(
                decode(&framed(9, &body[..cut])),
                Err(WireError::Malformed { .. })
            ),
            "{cut} bytes"
        );
    }
    assert!(matches!(
        check_header(&[9, 0, 0, 0, 0, 0, 0, 19]),
        Err(WireError::TooLong {
            len: 19,
            max: 18,
            ..
        })
    ));
}
