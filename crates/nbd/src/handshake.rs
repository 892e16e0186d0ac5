//! The fixed newstyle handshake: the greeting, the client's flags, then
//! option haggling until the client enters transmission (NBD_OPT_GO or
//! NBD_OPT_EXPORT_NAME), aborts, or breaks the protocol.
//!
//! Options are processed on a blocking task because looking up an export
//! and asking a device for its size may block.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::device::{BlockIo, Caps, Exports};
use crate::proto::*;
use crate::NbdError;

/// Longest option data accepted; longer options close the connection.
pub(crate) const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Preferred block size advertised in NBD_INFO_BLOCK_SIZE.
pub(crate) const PREFERRED_BLOCK: u32 = 4096;

/// What the handshake agreed on, for the transmission phase.
pub(crate) struct Session {
    pub device: Arc<dyn BlockIo>,
    pub export: String,
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    /// The id of `base:allocation`, if the client selected it.
    pub meta_context: Option<u32>,
}

/// The transmission flags of an export: exactly what its volume declares
/// (`caps`), and WRITE_ZEROES on every writable export (the server writes
/// zeros itself for a volume that cannot zero natively; FAST_ZERO only when
/// it can).
pub(crate) fn transmission_flags(caps: Caps, read_only: bool, structured: bool) -> u16 {
    let mut f = FLAG_HAS_FLAGS | FLAG_SEND_CACHE;
    if caps.flush {
        f |= FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN;
    }
    if caps.fua {
        f |= FLAG_SEND_FUA;
    }
    if read_only {
        f |= FLAG_READ_ONLY;
    } else {
        f |= FLAG_SEND_WRITE_ZEROES;
        if caps.trim {
            f |= FLAG_SEND_TRIM;
        }
        if caps.write_zeroes {
            f |= FLAG_SEND_FAST_ZERO;
        }
    }
    if structured {
        f |= FLAG_SEND_DF;
    }
    f
}

/// What to do after one option.
enum Step {
    Continue,
    Abort,
    Enter(Session),
    Fail(NbdError),
}

/// Option haggling state.
struct Negotiation {
    exports: Arc<dyn Exports>,
    max_payload: u32,
    no_zeroes: bool,
    structured: bool,
    /// The export for which `base:allocation` was selected, if any.
    meta_export: Option<String>,
    /// Replies to send for the current option.
    out: Vec<u8>,
}

/// Runs the handshake. `Ok(None)` when the client aborted cleanly.
pub(crate) async fn negotiate<R, W>(
    r: &mut R,
    w: &mut W,
    exports: Arc<dyn Exports>,
    max_payload: u32,
) -> Result<Option<Session>, NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut greeting = [0u8; 18];
    greeting[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    greeting[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    greeting[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&greeting).await?;
    w.flush().await?;

    let client_flags = r.read_u32().await?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(NbdError::ClientFlags(client_flags));
    }
    let mut n = Negotiation {
        exports,
        max_payload,
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        structured: false,
        meta_export: None,
        out: Vec::new(),
    };
    loop {
        let mut head = [0u8; OPTION_HEADER_LEN];
        r.read_exact(&mut head).await?;
        let (magic, option, length) = decode_option_header(&head);
        if magic != IHAVEOPT {
            return Err(NbdError::OptionMagic(magic));
        }
        if length > MAX_OPTION_LEN {
            return Err(NbdError::OptionTooLong {
                option,
                length,
                limit: MAX_OPTION_LEN,
            });
        }
        let mut data = vec![0u8; length as usize];
        r.read_exact(&mut data).await?;
        tracing::debug!(option, length, "option");

        let (back, step) = tokio::task::spawn_blocking(move || {
            let step = n.option(option, &data);
            (n, step)
        })
        .await
        .map_err(|e| NbdError::Io(std::io::Error::other(format!("option handler failed: {e}"))))?;
        n = back;
        w.write_all(&n.out).await?;
        w.flush().await?;
        n.out.clear();
        match step {
            Step::Continue => {}
            Step::Abort => return Ok(None),
            Step::Enter(s) => return Ok(Some(s)),
            Step::Fail(e) => return Err(e),
        }
    }
}

impl Negotiation {
    fn reply(&mut self, option: u32, kind: u32, data: &[&[u8]]) {
        option_reply(&mut self.out, option, kind, data);
    }

    fn error(&mut self, option: u32, kind: u32, message: &str) -> Step {
        tracing::debug!(option, kind, message, "option refused");
        self.reply(option, kind, &[message.as_bytes()]);
        Step::Continue
    }

    fn ack(&mut self, option: u32) -> Step {
        self.reply(option, REP_ACK, &[]);
        Step::Continue
    }

    fn option(&mut self, option: u32, data: &[u8]) -> Step {
        match option {
            OPT_EXPORT_NAME => self.export_name(data),
            OPT_ABORT => {
                self.reply(option, REP_ACK, &[]);
                Step::Abort
            }
            OPT_LIST if !data.is_empty() => {
                self.error(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")
            }
            OPT_LIST => {
                for (name, description) in self.exports.list() {
                    let len = (name.len() as u32).to_be_bytes();
                    self.reply(
                        option,
                        REP_SERVER,
                        &[&len, name.as_bytes(), description.as_bytes()],
                    );
                }
                self.ack(option)
            }
            OPT_INFO | OPT_GO => self.info(option, data),
            OPT_STRUCTURED_REPLY if !data.is_empty() => self.error(
                option,
                REP_ERR_INVALID,
                "NBD_OPT_STRUCTURED_REPLY takes no data",
            ),
            OPT_STRUCTURED_REPLY => {
                self.structured = true;
                self.ack(option)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(option, data),
            _ => self.error(option, REP_ERR_UNSUP, "option not supported by this server"),
        }
    }

    /// The device, size and flags of an export, or why not.
    fn open(&self, name: &str) -> Result<(Arc<dyn BlockIo>, u64, u16), NbdError> {
        let Some(device) = self.exports.lookup(name) else {
            return Err(NbdError::UnknownExport(name.to_string()));
        };
        let size = device.size().map_err(|source| NbdError::Export {
            name: name.to_string(),
            source,
        })?;
        let flags = transmission_flags(device.caps(), device.read_only(), self.structured);
        Ok((device, size, flags))
    }

    fn session(&self, name: &str, device: Arc<dyn BlockIo>, size: u64, flags: u16) -> Session {
        let selected = self.structured && self.meta_export.as_deref() == Some(name);
        Session {
            device,
            export: name.to_string(),
            size,
            flags,
            structured: self.structured,
            meta_context: selected.then_some(BASE_ALLOCATION_ID),
        }
    }

    fn export_name(&mut self, data: &[u8]) -> Step {
        let Some(name) = check_string(data) else {
            return Step::Fail(NbdError::UnknownExport(
                String::from_utf8_lossy(data).into_owned(),
            ));
        };
        let (device, size, flags) = match self.open(name) {
            Ok(x) => x,
            Err(e) => return Step::Fail(e),
        };
        self.out.extend_from_slice(&size.to_be_bytes());
        self.out.extend_from_slice(&flags.to_be_bytes());
        if !self.no_zeroes {
            self.out.extend_from_slice(&[0u8; 124]);
        }
        Step::Enter(self.session(name, device, size, flags))
    }

    fn info(&mut self, option: u32, data: &[u8]) -> Step {
        let mut c = Cursor::new(data);
        let parsed = (|| {
            let name = c.string()?;
            let count = c.u16()?;
            let mut wanted = Vec::new();
            for _ in 0..count {
                wanted.push(c.u16()?);
            }
            (c.remaining() == 0).then_some((name, wanted))
        })();
        let Some((name, wanted)) = parsed else {
            return self.error(
                option,
                REP_ERR_INVALID,
                "malformed NBD_OPT_INFO/NBD_OPT_GO data",
            );
        };
        let (device, size, flags) = match self.open(name) {
            Ok(x) => x,
            Err(e) => return self.error(option, REP_ERR_UNKNOWN, &e.to_string()),
        };
        let mut export = [0u8; 12];
        export[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
        export[2..10].copy_from_slice(&size.to_be_bytes());
        export[10..12].copy_from_slice(&flags.to_be_bytes());
        self.reply(option, REP_INFO, &[&export]);
        if wanted.contains(&INFO_NAME) {
            self.reply(
                option,
                REP_INFO,
                &[&INFO_NAME.to_be_bytes(), name.as_bytes()],
            );
        }
        if wanted.contains(&INFO_DESCRIPTION) {
            let description = self
                .exports
                .list()
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| d);
            if let Some(d) = description.filter(|d| !d.is_empty() && d.len() <= MAX_STRING) {
                self.reply(
                    option,
                    REP_INFO,
                    &[&INFO_DESCRIPTION.to_be_bytes(), d.as_bytes()],
                );
            }
        }
        let max = self.max_payload.max(1);
        let mut block = [0u8; 14];
        block[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        block[2..6].copy_from_slice(&1u32.to_be_bytes());
        block[6..10].copy_from_slice(&PREFERRED_BLOCK.min(max).to_be_bytes());
        block[10..14].copy_from_slice(&max.to_be_bytes());
        self.reply(option, REP_INFO, &[&block]);
        self.reply(option, REP_ACK, &[]);
        if option == OPT_GO {
            Step::Enter(self.session(name, device, size, flags))
        } else {
            Step::Continue
        }
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) -> Step {
        let set = option == OPT_SET_META_CONTEXT;
        if set && !self.structured {
            return self.error(
                option,
                REP_ERR_INVALID,
                "NBD_OPT_SET_META_CONTEXT needs structured replies",
            );
        }
        let mut c = Cursor::new(data);
        let parsed = (|| {
            let name = c.string()?;
            let count = c.u32()?;
            let mut queries = Vec::new();
            for _ in 0..count {
                // Each query takes at least four bytes, so this loop ends
                // after at most MAX_OPTION_LEN / 4 rounds.
                queries.push(c.string()?);
            }
            (c.remaining() == 0).then_some((name, queries))
        })();
        let Some((name, queries)) = parsed else {
            return self.error(option, REP_ERR_INVALID, "malformed meta context request");
        };
        let Some(device) = self.exports.lookup(name) else {
            return self.error(
                option,
                REP_ERR_UNKNOWN,
                &format!("no export named {name:?}"),
            );
        };
        // base:allocation only for a volume that reports allocation.
        let offered = device.caps().block_status;
        drop(device);
        let selected = offered
            && if set {
                queries.contains(&BASE_ALLOCATION)
            } else {
                queries.is_empty()
                    || queries
                        .iter()
                        .any(|q| *q == BASE_ALLOCATION || *q == "base:")
            };
        let name = name.to_string();
        if selected {
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            self.reply(
                option,
                REP_META_CONTEXT,
                &[&id.to_be_bytes(), BASE_ALLOCATION.as_bytes()],
            );
        }
        if set {
            self.meta_export = selected.then_some(name);
        }
        self.ack(option)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;
    use crate::ServerOptions;

    const FLAGS: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

    fn option_header(option: u32, len: u32) -> Vec<u8> {
        [
            &IHAVEOPT.to_be_bytes()[..],
            &option.to_be_bytes(),
            &len.to_be_bytes(),
        ]
        .concat()
    }

    #[tokio::test]
    async fn unknown_client_flags_close() {
        let c = Client::with_flags(FLAGS | 4).await;
        assert!(matches!(c.closed().await, Err(NbdError::ClientFlags(7))));
    }

    #[tokio::test]
    async fn bad_option_magic_closes() {
        let mut c = Client::with_flags(FLAGS).await;
        c.send(&[b'X'; 16]).await;
        assert!(matches!(c.closed().await, Err(NbdError::OptionMagic(_))));
    }

    #[tokio::test]
    async fn absurd_option_length_closes() {
        let mut c = Client::with_flags(FLAGS).await;
        c.send(&option_header(OPT_GO, 1 << 30)).await;
        assert!(matches!(
            c.closed().await,
            Err(NbdError::OptionTooLong {
                length: 0x4000_0000,
                ..
            })
        ));
    }

    #[tokio::test]
    async fn truncated_option_ends_the_connection() {
        let mut c = Client::with_flags(FLAGS).await;
        c.send(&option_header(OPT_GO, 100)).await;
        c.send(&[0; 10]).await;
        c.w.shutdown().await.unwrap();
        assert!(matches!(c.closed().await, Err(NbdError::Io(_))));
        // And mid-header.
        let mut c = Client::with_flags(FLAGS).await;
        c.send(&option_header(OPT_GO, 100)[..7]).await;
        c.w.shutdown().await.unwrap();
        assert!(matches!(c.closed().await, Err(NbdError::Io(_))));
    }

    #[tokio::test]
    async fn list_exports() {
        let mut c = Client::with_flags(FLAGS).await;
        let r = c.option(OPT_LIST, &[]).await;
        assert_eq!(r.len(), 4);
        assert!(r[..3]
            .iter()
            .all(|r| r.kind == REP_SERVER && r.option == OPT_LIST));
        assert_eq!(
            r[0].data,
            [&[0, 0, 0, 4][..], b"disk", b"a test disk"].concat()
        );
        assert_eq!(r[1].data, [&[0, 0, 0, 2][..], b"ro"].concat());
        assert_eq!(r[3].kind, REP_ACK);
        let r = c.option(OPT_LIST, &[1]).await;
        assert_eq!(r[0].kind, REP_ERR_INVALID);
        assert_eq!(c.option(OPT_ABORT, &[]).await[0].kind, REP_ACK);
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn info_describes_an_export_and_stays_in_negotiation() {
        let mut c = Client::with_flags(FLAGS).await;
        let r = c
            .option(
                OPT_INFO,
                &info_request("disk", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
            )
            .await;
        assert_eq!(r.len(), 5, "{r:?}");
        let flags = transmission_flags(Caps::ALL, false, false);
        assert_eq!(
            r[0].data,
            [
                &[0, 0][..],
                &(SIZE as u64).to_be_bytes(),
                &flags.to_be_bytes()
            ]
            .concat()
        );
        assert_eq!(r[1].data, [&[0, 1][..], b"disk"].concat());
        assert_eq!(r[2].data, [&[0, 2][..], b"a test disk"].concat());
        assert_eq!(
            r[3].data,
            [
                &[0, 3][..],
                &[0, 0, 0, 1],
                &[0, 0, 16, 0],
                &(32u32 << 20).to_be_bytes()
            ]
            .concat()
        );
        assert_eq!(r[4].kind, REP_ACK);
        assert!(r.iter().all(|r| r.option == OPT_INFO));
        // Read-only export: READ_ONLY set, write features not offered.
        let r = c.option(OPT_INFO, &info_request("ro", &[])).await;
        let f = u16::from_be_bytes(r[0].data[10..12].try_into().unwrap());
        assert_ne!(f & FLAG_READ_ONLY, 0);
        assert_eq!(f & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES), 0);
        assert_eq!(f & FLAG_SEND_DF, 0, "DF needs structured replies");
        assert_ne!(f & FLAG_CAN_MULTI_CONN, 0);
        assert_eq!(c.option(OPT_ABORT, &[]).await[0].kind, REP_ACK);
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn info_errors() {
        let mut c = Client::with_flags(FLAGS).await;
        assert_eq!(
            c.option(OPT_GO, &info_request("nope", &[])).await[0].kind,
            REP_ERR_UNKNOWN
        );
        let mut bad = info_request("disk", &[1]);
        bad.push(0); // trailing byte
        assert_eq!(c.option(OPT_GO, &bad).await[0].kind, REP_ERR_INVALID);
        assert_eq!(
            c.option(OPT_GO, &[0, 0, 0, 9, b'd']).await[0].kind,
            REP_ERR_INVALID
        );
        assert_eq!(c.option(OPT_GO, &[0, 0]).await[0].kind, REP_ERR_INVALID);
        assert_eq!(
            c.option(OPT_INFO, &[0, 0, 0, 1, 0xff, 0, 0]).await[0].kind,
            REP_ERR_INVALID
        );
        // A name longer than the protocol's limit.
        let long = "n".repeat(5000);
        assert_eq!(
            c.option(OPT_INFO, &info_request(&long, &[])).await[0].kind,
            REP_ERR_INVALID
        );
        // Still negotiating: GO now works.
        let r = c.option(OPT_GO, &info_request("disk", &[])).await;
        assert_eq!(r.last().unwrap().kind, REP_ACK);
        c.request(CMD_DISC, 0, 1, 0, 0).await;
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn unknown_and_unsupported_options() {
        let mut c = Client::with_flags(FLAGS).await;
        let r = c.option(99, &[1, 2, 3]).await;
        assert_eq!((r[0].option, r[0].kind), (99, REP_ERR_UNSUP));
        assert_eq!(c.option(OPT_STARTTLS, &[]).await[0].kind, REP_ERR_UNSUP);
        assert_eq!(
            c.option(OPT_STRUCTURED_REPLY, &[0]).await[0].kind,
            REP_ERR_INVALID
        );
        assert_eq!(c.option(OPT_ABORT, &[]).await[0].kind, REP_ACK);
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn meta_contexts() {
        let mut c = Client::with_flags(FLAGS).await;
        let set = meta_request("disk", &[BASE_ALLOCATION]);
        assert_eq!(
            c.option(OPT_SET_META_CONTEXT, &set).await[0].kind,
            REP_ERR_INVALID,
            "needs structured"
        );
        let r = c
            .option(OPT_LIST_META_CONTEXT, &meta_request("disk", &[]))
            .await;
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].kind, REP_META_CONTEXT);
        assert_eq!(r[0].data, [&[0, 0, 0, 0][..], b"base:allocation"].concat());
        let r = c
            .option(OPT_LIST_META_CONTEXT, &meta_request("disk", &["base:"]))
            .await;
        assert_eq!(r[0].kind, REP_META_CONTEXT);
        let r = c
            .option(
                OPT_LIST_META_CONTEXT,
                &meta_request("disk", &["x-other:thing"]),
            )
            .await;
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kind, REP_ACK);
        assert_eq!(
            c.option(OPT_LIST_META_CONTEXT, &meta_request("nope", &[]))
                .await[0]
                .kind,
            REP_ERR_UNKNOWN
        );
        assert_eq!(
            c.option(OPT_LIST_META_CONTEXT, &set[..set.len() - 1]).await[0].kind,
            REP_ERR_INVALID
        );
        assert_eq!(
            c.option(OPT_LIST_META_CONTEXT, &[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff])
                .await[0]
                .kind,
            REP_ERR_INVALID
        );

        assert_eq!(c.option(OPT_STRUCTURED_REPLY, &[]).await[0].kind, REP_ACK);
        let r = c
            .option(
                OPT_SET_META_CONTEXT,
                &meta_request("disk", &["base:", "x:y", BASE_ALLOCATION]),
            )
            .await;
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0].data,
            [&BASE_ALLOCATION_ID.to_be_bytes()[..], b"base:allocation"].concat()
        );
        let r = c
            .option(OPT_SET_META_CONTEXT, &meta_request("disk", &["x:y"]))
            .await;
        assert_eq!(r.len(), 1, "nothing selected");
        assert_eq!(c.option(OPT_ABORT, &[]).await[0].kind, REP_ACK);
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn meta_context_is_per_export() {
        // base:allocation set for "ro", then GO to "disk": BLOCK_STATUS is
        // not negotiated there.
        let mut c = Client::with_flags(FLAGS).await;
        c.option(OPT_STRUCTURED_REPLY, &[]).await;
        c.option(
            OPT_SET_META_CONTEXT,
            &meta_request("ro", &[BASE_ALLOCATION]),
        )
        .await;
        let r = c.option(OPT_GO, &info_request("disk", &[])).await;
        assert_eq!(r.last().unwrap().kind, REP_ACK);
        c.request(CMD_BLOCK_STATUS, 0, 5, 0, 4096).await;
        let ch = c.chunk().await;
        assert_eq!(
            (ch.kind, ch.cookie, ch.errno()),
            (REPLY_TYPE_ERROR, 5, EINVAL)
        );
        c.request(CMD_DISC, 0, 1, 0, 0).await;
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn export_name_unknown_closes_known_enters() {
        let mut c = Client::with_flags(FLAGS).await;
        c.send(&option_header(OPT_EXPORT_NAME, 4)).await;
        c.send(b"nope").await;
        assert!(matches!(c.closed().await, Err(NbdError::UnknownExport(n)) if n == "nope"));

        let mut c = Client::with_flags(FLAG_C_FIXED_NEWSTYLE).await;
        c.send(&option_header(OPT_EXPORT_NAME, 4)).await;
        c.send(b"disk").await;
        let mut h = [0u8; 10 + 124];
        c.r.read_exact(&mut h).await.unwrap();
        assert_eq!(&h[0..8], &(SIZE as u64).to_be_bytes());
        assert_eq!(
            u16::from_be_bytes([h[8], h[9]]),
            transmission_flags(Caps::ALL, false, false)
        );
        assert!(h[10..].iter().all(|b| *b == 0));
        c.request(CMD_DISC, 0, 1, 0, 0).await;
        assert!(c.closed().await.is_ok());
    }

    #[tokio::test]
    async fn block_size_follows_max_payload() {
        let opts = ServerOptions {
            max_payload: 1024,
            ..ServerOptions::default()
        };
        let mut c = Client::start(exports().0, opts).await;
        c.send(&FLAGS.to_be_bytes()).await;
        let r = c
            .option(OPT_INFO, &info_request("disk", &[INFO_BLOCK_SIZE]))
            .await;
        assert_eq!(
            r[1].data,
            [
                &[0, 3][..],
                &[0, 0, 0, 1],
                &1024u32.to_be_bytes(),
                &1024u32.to_be_bytes()
            ]
            .concat()
        );
    }
}
