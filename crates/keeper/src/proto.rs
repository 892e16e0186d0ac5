//! The keeper's messages (docs/keeper.md, "Protocol"). One message is one
//! `SOCK_SEQPACKET` datagram: a version byte (1), a kind byte, then the
//! kind's fields; strings and byte strings are a u16 little-endian length
//! and that many bytes. Descriptors travel beside a message as
//! `SCM_RIGHTS`. A message that is too long, has bytes left over, or has a
//! field out of its bounds is refused whole.

pub const VERSION: u8 = 1;
/// The longest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 8192;
/// A key: 1 to 4096 bytes of UTF-8 (the daemon uses the file's path).
pub const MAX_KEY: usize = 4096;
/// A token: at most 256 bytes.
pub const MAX_TOKEN: usize = 256;
/// An error's text: at most 1024 bytes of UTF-8.
pub const MAX_TEXT: usize = 1024;
/// Descriptors beside one message: 1 to 16 with `Put` and `Entry`, none
/// with the others.
pub const MAX_FDS: usize = 16;

pub mod kind {
    pub const PUT: u8 = 1;
    pub const DROP: u8 = 2;
    pub const LIST: u8 = 3;
    pub const OK: u8 = 0x80;
    pub const ERROR: u8 = 0x81;
    pub const ENTRY: u8 = 0x82;
    pub const END: u8 = 0x83;
}

/// One message, either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Hold these descriptors under `key` (replacing what it held).
    Put {
        key: String,
        token: Vec<u8>,
    },
    /// Let go of what `key` holds (closing its descriptors).
    Drop {
        key: String,
    },
    /// Send every entry (copies of its descriptors), then `End`.
    List,
    Ok,
    Error {
        text: String,
    },
    Entry {
        key: String,
        token: Vec<u8>,
    },
    End,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("an empty message")]
    Empty,
    #[error("version {0}, not {VERSION}")]
    Version(u8),
    #[error("unknown kind {0:#x}")]
    Kind(u8),
    #[error("message too long ({0} bytes, at most {MAX_MESSAGE})")]
    TooLong(usize),
    #[error("message ends inside a field")]
    Short,
    #[error("{0} bytes left over after the message")]
    Trailing(usize),
    #[error("{field} of {len} bytes is out of bounds (1 to {max})")]
    Bounds {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{0} is not UTF-8")]
    Utf8(&'static str),
    #[error("{got} descriptors with this message (it takes {want})")]
    Descriptors { got: usize, want: &'static str },
}

impl Message {
    /// How many descriptors may come with this message.
    pub fn descriptors(&self) -> std::ops::RangeInclusive<usize> {
        match self {
            Message::Put { .. } | Message::Entry { .. } => 1..=MAX_FDS,
            _ => 0..=0,
        }
    }

    /// Refuse a message with the wrong number of descriptors.
    pub fn check_descriptors(&self, got: usize) -> Result<(), ProtoError> {
        if self.descriptors().contains(&got) {
            Ok(())
        } else {
            Err(ProtoError::Descriptors {
                got,
                want: if *self.descriptors().end() == 0 {
                    "none"
                } else {
                    "1 to 16"
                },
            })
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![VERSION];
        let s16 = |b: &mut Vec<u8>, s: &[u8]| {
            b.extend_from_slice(&(s.len() as u16).to_le_bytes());
            b.extend_from_slice(s);
        };
        match self {
            Message::Put { key, token } => {
                b.push(kind::PUT);
                s16(&mut b, key.as_bytes());
                s16(&mut b, token);
            }
            Message::Drop { key } => {
                b.push(kind::DROP);
                s16(&mut b, key.as_bytes());
            }
            Message::List => b.push(kind::LIST),
            Message::Ok => b.push(kind::OK),
            Message::Error { text } => {
                b.push(kind::ERROR);
                let t = clip(text, MAX_TEXT);
                s16(&mut b, t.as_bytes());
            }
            Message::Entry { key, token } => {
                b.push(kind::ENTRY);
                s16(&mut b, key.as_bytes());
                s16(&mut b, token);
            }
            Message::End => b.push(kind::END),
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Message, ProtoError> {
        if b.len() > MAX_MESSAGE {
            return Err(ProtoError::TooLong(b.len()));
        }
        let (&v, rest) = b.split_first().ok_or(ProtoError::Empty)?;
        if v != VERSION {
            return Err(ProtoError::Version(v));
        }
        let (&k, rest) = rest.split_first().ok_or(ProtoError::Short)?;
        let mut r = Reader(rest);
        let m = match k {
            kind::PUT => Message::Put {
                key: r.key()?,
                token: r.bytes("token", 0, MAX_TOKEN)?.to_vec(),
            },
            kind::DROP => Message::Drop { key: r.key()? },
            kind::LIST => Message::List,
            kind::OK => Message::Ok,
            kind::ERROR => Message::Error {
                text: std::str::from_utf8(r.bytes("text", 0, MAX_TEXT)?)
                    .map_err(|_| ProtoError::Utf8("text"))?
                    .to_string(),
            },
            kind::ENTRY => Message::Entry {
                key: r.key()?,
                token: r.bytes("token", 0, MAX_TOKEN)?.to_vec(),
            },
            kind::END => Message::End,
            k => return Err(ProtoError::Kind(k)),
        };
        if !r.0.is_empty() {
            return Err(ProtoError::Trailing(r.0.len()));
        }
        Ok(m)
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(
        &mut self,
        field: &'static str,
        min: usize,
        max: usize,
    ) -> Result<&'a [u8], ProtoError> {
        if self.0.len() < 2 {
            return Err(ProtoError::Short);
        }
        let len = u16::from_le_bytes([self.0[0], self.0[1]]) as usize;
        if len < min || len > max {
            return Err(ProtoError::Bounds { field, len, max });
        }
        let rest = &self.0[2..];
        if rest.len() < len {
            return Err(ProtoError::Short);
        }
        let (v, rest) = rest.split_at(len);
        self.0 = rest;
        Ok(v)
    }

    fn key(&mut self) -> Result<String, ProtoError> {
        let b = self.bytes("key", 1, MAX_KEY)?;
        Ok(std::str::from_utf8(b)
            .map_err(|_| ProtoError::Utf8("key"))?
            .to_string())
    }
}

/// Check a key before sending it.
pub fn check_key(key: &str) -> Result<(), ProtoError> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(ProtoError::Bounds {
            field: "key",
            len: key.len(),
            max: MAX_KEY,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn message() -> impl Strategy<Value = Message> {
        let key = "[a-z/._-]{1,64}";
        let token = proptest::collection::vec(any::<u8>(), 0..=MAX_TOKEN);
        prop_oneof![
            (key, token.clone()).prop_map(|(key, token)| Message::Put { key, token }),
            key.prop_map(|key| Message::Drop { key }),
            Just(Message::List),
            Just(Message::Ok),
            ".{0,200}".prop_map(|text| Message::Error { text }),
            (key, token).prop_map(|(key, token)| Message::Entry { key, token }),
            Just(Message::End),
        ]
    }

    proptest! {
        #[test]
        fn every_message_decodes_to_itself(m in message()) {
            prop_assert_eq!(Message::decode(&m.encode()), Ok(m));
        }

        #[test]
        fn a_message_cut_short_or_extended_is_refused(m in message(), extra in 1usize..8) {
            let b = m.encode();
            for n in 0..b.len() {
                prop_assert!(Message::decode(&b[..n]).is_err());
            }
            let mut longer = b.clone();
            longer.extend(std::iter::repeat_n(0u8, extra));
            prop_assert!(Message::decode(&longer).is_err());
        }

        #[test]
        fn junk_is_refused_or_decoded_never_a_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Message::decode(&b);
        }
    }

    #[test]
    fn a_message_is_laid_out_as_documented() {
        let put = Message::Put {
            key: "ab".into(),
            token: vec![9],
        };
        assert_eq!(put.encode(), [1, 1, 2, 0, b'a', b'b', 1, 0, 9]);
        assert_eq!(Message::List.encode(), [1, 3]);
        assert_eq!(Message::decode(&[2, 3]), Err(ProtoError::Version(2)));
        assert_eq!(Message::decode(&[1, 9]), Err(ProtoError::Kind(9)));
        // An empty key is out of bounds.
        assert!(matches!(
            Message::decode(&[1, 2, 0, 0]),
            Err(ProtoError::Bounds { field: "key", .. })
        ));
        assert!(Message::decode(&vec![1; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn descriptors_are_counted_per_kind() {
        let put = Message::Put {
            key: "k".into(),
            token: vec![],
        };
        assert!(put.check_descriptors(0).is_err());
        assert!(put.check_descriptors(1).is_ok());
        assert!(put.check_descriptors(MAX_FDS + 1).is_err());
        assert!(Message::List.check_descriptors(1).is_err());
        assert!(Message::List.check_descriptors(0).is_ok());
    }

    #[test]
    fn a_long_error_text_is_cut_at_a_character() {
        let m = Message::Error {
            text: "é".repeat(MAX_TEXT),
        };
        match Message::decode(&m.encode()).unwrap() {
            Message::Error { text } => {
                assert!(text.len() <= MAX_TEXT && text.chars().all(|c| c == 'é'))
            }
            other => panic!("{other:?}"),
        }
    }
}
