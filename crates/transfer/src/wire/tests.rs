use super::*;
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
        any::<[u64; 4]>().prop_map(
            |[id, size, data_bytes, skipped_bytes]| Frame::Answer(Answer {
                id,
                size,
                data_bytes,
                skipped_bytes
            })
        ),
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
        kind in 0u8..9,
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
        check_header(&[9, 0, 0, 0, 0, 0, 0, 0]),
        Err(WireError::UnknownKind(9))
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
