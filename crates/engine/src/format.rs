//! The on-disk format: constants, the common page header, the superblock and
//! catalog records. `docs/on-disk-format.md` describes every byte; keep the
//! two in step. Everything here is pure (no I/O) so it can be fuzzed.

use crate::error::{Error, Result};

/// Size of a block: the unit of data allocation and of metadata pages.
pub const BLOCK: usize = 4096;
/// Bytes of the header every metadata page starts with.
pub const HEADER: usize = 64;
/// Child pointers per tree node.
pub const FANOUT: usize = (BLOCK - HEADER) / 8;
/// Blocks per allocation group; each group's second block holds their refcounts.
pub const GROUP: u64 = ((BLOCK - HEADER) / 4) as u64;
/// Refcount of blocks the engine reserves for itself (superblock, refcount pages).
pub const RC_SYSTEM: u32 = u32::MAX;
/// Refcount of a tree node on the dead list, awaiting reclaim.
pub const RC_DEAD: u32 = u32::MAX - 1;
/// Highest refcount a shared block may reach.
pub const RC_MAX: u32 = u32::MAX - 2;
/// Version of this format; a pool of another version is refused, except
/// version 1 (before the journal), which is read and upgraded on open.
pub const FORMAT_VERSION: u32 = 2;
/// The version before the journal of index changes (`journal.rs`).
pub const FORMAT_VERSION_NO_JOURNAL: u32 = 1;
/// Deepest tree supported: FANOUT^6 blocks is far beyond any disk.
pub const MAX_LEVELS: u8 = 6;

pub const MAGIC_SUPER: u32 = u32::from_le_bytes(*b"LMSB");
pub const MAGIC_NODE: u32 = u32::from_le_bytes(*b"LMND");
pub const MAGIC_RC: u32 = u32::from_le_bytes(*b"LMRC");
pub const MAGIC_RECORD: u32 = u32::from_le_bytes(*b"LMRE");

/// A metadata page or data block.
pub type Page = [u8; BLOCK];

pub fn new_page() -> Box<Page> {
    Box::new([0u8; BLOCK])
}

pub fn get_u64(p: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(p[at..at + 8].try_into().unwrap())
}
pub fn put_u64(p: &mut [u8], at: usize, v: u64) {
    p[at..at + 8].copy_from_slice(&v.to_le_bytes())
}
pub fn get_u32(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(p[at..at + 4].try_into().unwrap())
}
pub fn put_u32(p: &mut [u8], at: usize, v: u32) {
    p[at..at + 4].copy_from_slice(&v.to_le_bytes())
}

/// Block of the refcount page of the group holding `block`.
pub fn rc_page_of(block: u64) -> u64 {
    (block / GROUP) * GROUP + 1
}

/// True for blocks the engine reserves: the superblock and refcount pages.
pub fn is_system_block(block: u64) -> bool {
    block == 0 || block % GROUP == 1
}

fn page_crc(p: &Page) -> u32 {
    let c = crc32c::crc32c(&p[0..4]);
    crc32c::crc32c_append(c, &p[8..])
}

/// Stamp a page with its own address, the transaction that wrote it and its checksum.
pub fn seal(p: &mut Page, block: u64, txn: u64) {
    put_u64(p, 8, block);
    put_u64(p, 16, txn);
    let crc = page_crc(p);
    put_u32(p, 4, crc);
}

/// Check a page read from `block`: magic, checksum and self-address.
pub fn verify(p: &Page, block: u64, magic: u32) -> Result<()> {
    let m = get_u32(p, 0);
    if m != magic {
        if p.iter().all(|&b| b == 0) {
            return Err(Error::corrupt(
                block,
                "expected a metadata page, found zeros",
            ));
        }
        return Err(Error::corrupt(
            block,
            format!("bad magic {:#010x}, expected {:#010x}", m, magic),
        ));
    }
    let crc = get_u32(p, 4);
    if crc != page_crc(p) {
        return Err(Error::corrupt(block, "checksum mismatch"));
    }
    let at = get_u64(p, 8);
    if at != block {
        return Err(Error::corrupt(
            block,
            format!("page claims to be block {at} (misdirected write)"),
        ));
    }
    Ok(())
}

/// Node header accessors (see docs/on-disk-format.md, "Tree node").
pub mod node {
    use super::*;
    pub fn init(p: &mut Page, level: u8) {
        p.fill(0);
        put_u32(p, 0, MAGIC_NODE);
        p[24] = level;
    }
    pub fn level(p: &Page) -> u8 {
        p[24]
    }
    pub fn next_dead(p: &Page) -> u64 {
        get_u64(p, 32)
    }
    pub fn set_next_dead(p: &mut Page, v: u64) {
        put_u64(p, 32, v)
    }
    pub fn entry(p: &Page, i: usize) -> u64 {
        get_u64(p, HEADER + 8 * i)
    }
    pub fn set_entry(p: &mut Page, i: usize, v: u64) {
        put_u64(p, HEADER + 8 * i, v)
    }
}

/// Refcount page accessors.
pub mod rc {
    use super::*;
    pub fn init(p: &mut Page, group: u64) {
        p.fill(0);
        put_u32(p, 0, MAGIC_RC);
        put_u64(p, 24, group);
    }
    pub fn get(p: &Page, i: usize) -> u32 {
        get_u32(p, HEADER + 4 * i)
    }
    pub fn set(p: &mut Page, i: usize, v: u32) {
        put_u32(p, HEADER + 4 * i, v)
    }
}

/// The pool's root of everything, at block 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub pool_id: [u8; 16],
    /// Blocks in the pool file (always whole groups).
    pub total_blocks: u64,
    /// Root and height of the catalog tree (object id -> record page).
    pub catalog_root: u64,
    pub catalog_levels: u8,
    /// First node of the list of dead tree nodes awaiting reclaim.
    pub dead_head: u64,
    /// Next object id to hand out.
    pub next_id: u64,
    /// Capacity limit in blocks (0 = the disk's).
    pub max_blocks: u64,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created: u64,
    /// The last journal record whose change this state holds (version 2;
    /// 0 in version 1, which had no journal).
    pub journal_covered: u64,
    /// The format version read from disk ([`FORMAT_VERSION`] once
    /// written by this build, which always writes the current one).
    pub version: u32,
}

impl Superblock {
    pub fn encode(&self, p: &mut Page) {
        p.fill(0);
        put_u32(p, 0, MAGIC_SUPER);
        let b = HEADER;
        p[b..b + 8].copy_from_slice(b"LAMINA\0\0");
        put_u32(p, b + 8, FORMAT_VERSION);
        put_u32(p, b + 12, BLOCK as u32);
        put_u32(p, b + 16, GROUP as u32);
        put_u32(p, b + 20, FANOUT as u32);
        p[b + 24..b + 40].copy_from_slice(&self.pool_id);
        put_u64(p, b + 40, self.total_blocks);
        put_u64(p, b + 48, self.catalog_root);
        p[b + 56] = self.catalog_levels;
        put_u64(p, b + 64, self.dead_head);
        put_u64(p, b + 72, self.next_id);
        put_u64(p, b + 80, self.max_blocks);
        put_u64(p, b + 88, self.created);
        put_u64(p, b + 96, self.journal_covered);
    }

    /// Decode and validate the superblock; a foreign or newer file is refused.
    pub fn decode(p: &Page) -> Result<Superblock> {
        let b = HEADER;
        if get_u32(p, 0) != MAGIC_SUPER || &p[b..b + 8] != b"LAMINA\0\0" {
            return Err(Error::corrupt(0, "no Lamina superblock (not a pool file)"));
        }
        verify(p, 0, MAGIC_SUPER)?;
        let version = get_u32(p, b + 8);
        if version != FORMAT_VERSION && version != FORMAT_VERSION_NO_JOURNAL {
            return Err(Error::corrupt(
                0,
                format!(
                    "format version {version}; this build reads versions \
                     {FORMAT_VERSION_NO_JOURNAL} and {FORMAT_VERSION}"
                ),
            ));
        }
        let geometry = (get_u32(p, b + 12), get_u32(p, b + 16), get_u32(p, b + 20));
        if geometry != (BLOCK as u32, GROUP as u32, FANOUT as u32) {
            return Err(Error::corrupt(
                0,
                format!("unsupported geometry {geometry:?}"),
            ));
        }
        let sb = Superblock {
            pool_id: p[b + 24..b + 40].try_into().unwrap(),
            total_blocks: get_u64(p, b + 40),
            catalog_root: get_u64(p, b + 48),
            catalog_levels: p[b + 56],
            dead_head: get_u64(p, b + 64),
            next_id: get_u64(p, b + 72),
            max_blocks: get_u64(p, b + 80),
            created: get_u64(p, b + 88),
            journal_covered: if version == FORMAT_VERSION_NO_JOURNAL {
                0
            } else {
                get_u64(p, b + 96)
            },
            version,
        };
        if sb.total_blocks == 0 || !sb.total_blocks.is_multiple_of(GROUP) {
            return Err(Error::corrupt(
                0,
                format!("total_blocks {} is not whole groups", sb.total_blocks),
            ));
        }
        if sb.catalog_levels == 0 || sb.catalog_levels > MAX_LEVELS {
            return Err(Error::corrupt(
                0,
                format!("catalog height {} out of range", sb.catalog_levels),
            ));
        }
        for (what, v) in [
            ("catalog root", sb.catalog_root),
            ("dead list head", sb.dead_head),
        ] {
            if v >= sb.total_blocks {
                return Err(Error::corrupt(
                    0,
                    format!("{what} {v} is past the end of the pool"),
                ));
            }
        }
        Ok(sb)
    }
}

/// The link from a linked clone to the snapshot it was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub volume: u64,
    pub snapshot: u64,
    /// The snapshot's tree at clone time, referenced by the clone until it is
    /// flattened (0 once independent).
    pub root: u64,
    pub levels: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRec {
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub root: u64,
    pub levels: u8,
    pub created: u64,
    /// Snapshot the live data descends from (0: none).
    pub parent: u64,
    /// Blocks mapped in the live tree.
    pub mapped: u64,
    pub origin: Option<Origin>,
    /// A flatten was started and has not finished.
    pub flattening: bool,
    /// The volume's labels (sorted by key). A volume without labels is
    /// written as record version 1, byte for byte as before labels
    /// existed; one with labels as version 2 (labels appended).
    pub labels: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRec {
    pub id: u64,
    pub volume: u64,
    pub name: String,
    pub size: u64,
    pub root: u64,
    pub levels: u8,
    pub created: u64,
    /// Parent snapshot in the volume's tree (0: none).
    pub parent: u64,
    /// Made by the system (e.g. for a clone from a volume) rather than a user.
    pub system: bool,
    pub mapped: u64,
    pub labels: Vec<(String, String)>,
}

/// A deleted ("retired") volume that snapshots or linked clones still
/// name: its data, clone link and name are gone (a new volume may take the
/// name), and the record goes with the last snapshot of it and the last
/// linked clone made from one (docs/design.md, "Retired volumes").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetiredRec {
    pub id: u64,
    pub name: String,
    /// The volume's size when it was deleted.
    pub size: u64,
    /// When the volume was created, and when it was deleted (ns).
    pub created: u64,
    pub deleted: u64,
    pub labels: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Volume(VolumeRec),
    Snapshot(SnapshotRec),
    Retired(RetiredRec),
}

impl Record {
    pub fn id(&self) -> u64 {
        match self {
            Record::Volume(v) => v.id,
            Record::Snapshot(s) => s.id,
            Record::Retired(r) => r.id,
        }
    }
}

const KIND_VOLUME: u8 = 1;
const KIND_SNAPSHOT: u8 = 2;
const KIND_RETIRED: u8 = 3;
const RECORD_VERSION: u8 = 1;
/// A volume record with labels after its origin.
const RECORD_VERSION_LABELS: u8 = 2;

struct W<'a> {
    p: &'a mut [u8],
    at: usize,
}
impl W<'_> {
    fn bytes(&mut self, b: &[u8]) -> Result<()> {
        if self.at + b.len() > self.p.len() {
            return Err(Error::InvalidArgument(format!(
                "record does not fit in one {BLOCK}-byte page (names and labels too long)"
            )));
        }
        self.p[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
        Ok(())
    }
    fn u8(&mut self, v: u8) -> Result<()> {
        self.bytes(&[v])
    }
    fn u64(&mut self, v: u64) -> Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn str(&mut self, s: &str) -> Result<()> {
        let n =
            u16::try_from(s.len()).map_err(|_| Error::InvalidArgument("string too long".into()))?;
        self.bytes(&n.to_le_bytes())?;
        self.bytes(s.as_bytes())
    }
}

/// A bounds-checked little-endian reader of a record (a catalog record
/// page's, a journal record's); running short or a bad string is
/// `corrupt metadata at block BLOCK`, never a panic.
pub(crate) struct R<'a> {
    p: &'a [u8],
    at: usize,
    block: u64,
}
impl<'a> R<'a> {
    pub(crate) fn new(p: &'a [u8], block: u64) -> R<'a> {
        R { p, at: 0, block }
    }
    /// Bytes read so far.
    pub(crate) fn at(&self) -> usize {
        self.at
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.at + n > self.p.len() {
            return Err(Error::corrupt(self.block, "record truncated"));
        }
        let s = &self.p[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().unwrap()))
    }
    pub(crate) fn str(&mut self) -> Result<String> {
        let n = u16::from_le_bytes(self.bytes(2)?.try_into().unwrap()) as usize;
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::corrupt(self.block, "record string is not UTF-8"))
    }
    fn levels(&mut self) -> Result<u8> {
        let l = self.u8()?;
        if l == 0 || l > MAX_LEVELS {
            return Err(Error::corrupt(
                self.block,
                format!("tree height {l} out of range"),
            ));
        }
        Ok(l)
    }
}

/// Labels: a u16 count, then each key and value as strings.
fn write_labels(w: &mut W<'_>, labels: &[(String, String)]) -> Result<()> {
    let n = u16::try_from(labels.len())
        .map_err(|_| Error::InvalidArgument("too many labels".into()))?;
    w.bytes(&n.to_le_bytes())?;
    for (k, v) in labels {
        w.str(k)?;
        w.str(v)?;
    }
    Ok(())
}

pub(crate) fn read_labels(r: &mut R<'_>) -> Result<Vec<(String, String)>> {
    let n = u16::from_le_bytes(r.bytes(2)?.try_into().unwrap());
    let mut out = Vec::new();
    for _ in 0..n {
        let k = r.str()?;
        let v = r.str()?;
        out.push((k, v));
    }
    Ok(out)
}

impl Record {
    /// Encode into a record page body; fails if it does not fit.
    pub fn encode(&self, p: &mut Page) -> Result<()> {
        p.fill(0);
        put_u32(p, 0, MAGIC_RECORD);
        let mut w = W {
            p: &mut p[HEADER..],
            at: 0,
        };
        match self {
            Record::Volume(v) => {
                w.u8(KIND_VOLUME)?;
                w.u8(if v.labels.is_empty() {
                    RECORD_VERSION
                } else {
                    RECORD_VERSION_LABELS
                })?;
                w.u64(v.id)?;
                w.str(&v.name)?;
                w.u64(v.size)?;
                w.u64(v.root)?;
                w.u8(v.levels)?;
                w.u64(v.created)?;
                w.u64(v.parent)?;
                w.u64(v.mapped)?;
                w.u8(v.flattening as u8)?;
                match &v.origin {
                    None => w.u8(0)?,
                    Some(o) => {
                        w.u8(1)?;
                        w.u64(o.volume)?;
                        w.u64(o.snapshot)?;
                        w.u64(o.root)?;
                        w.u8(o.levels)?;
                    }
                }
                if !v.labels.is_empty() {
                    write_labels(&mut w, &v.labels)?;
                }
            }
            Record::Snapshot(s) => {
                w.u8(KIND_SNAPSHOT)?;
                w.u8(RECORD_VERSION)?;
                w.u64(s.id)?;
                w.u64(s.volume)?;
                w.str(&s.name)?;
                w.u64(s.size)?;
                w.u64(s.root)?;
                w.u8(s.levels)?;
                w.u64(s.created)?;
                w.u64(s.parent)?;
                w.u8(s.system as u8)?;
                w.u64(s.mapped)?;
                write_labels(&mut w, &s.labels)?;
            }
            Record::Retired(r) => {
                w.u8(KIND_RETIRED)?;
                w.u8(RECORD_VERSION)?;
                w.u64(r.id)?;
                w.str(&r.name)?;
                w.u64(r.size)?;
                w.u64(r.created)?;
                w.u64(r.deleted)?;
                write_labels(&mut w, &r.labels)?;
            }
        }
        Ok(())
    }

    /// Decode a record page read from `block` (checksum already verified).
    /// Never panics, whatever the bytes.
    pub fn decode(p: &Page, block: u64) -> Result<Record> {
        if get_u32(p, 0) != MAGIC_RECORD {
            return Err(Error::corrupt(block, "not a record page"));
        }
        let mut r = R::new(&p[HEADER..], block);
        let kind = r.u8()?;
        let version = r.u8()?;
        let volume_v2 = kind == KIND_VOLUME && version == RECORD_VERSION_LABELS;
        if version != RECORD_VERSION && !volume_v2 {
            return Err(Error::corrupt(
                block,
                format!("record version {version} unknown"),
            ));
        }
        let rec = match kind {
            KIND_VOLUME => {
                let mut v = VolumeRec {
                    id: r.u64()?,
                    name: r.str()?,
                    size: r.u64()?,
                    root: r.u64()?,
                    levels: r.levels()?,
                    created: r.u64()?,
                    parent: r.u64()?,
                    mapped: r.u64()?,
                    flattening: r.u8()? != 0,
                    origin: None,
                    labels: Vec::new(),
                };
                if r.u8()? == 1 {
                    v.origin = Some(Origin {
                        volume: r.u64()?,
                        snapshot: r.u64()?,
                        root: r.u64()?,
                        levels: r.levels()?,
                    });
                }
                if volume_v2 {
                    v.labels = read_labels(&mut r)?;
                }
                Record::Volume(v)
            }
            KIND_SNAPSHOT => {
                let mut s = SnapshotRec {
                    id: r.u64()?,
                    volume: r.u64()?,
                    name: r.str()?,
                    size: r.u64()?,
                    root: r.u64()?,
                    levels: r.levels()?,
                    created: r.u64()?,
                    parent: r.u64()?,
                    system: r.u8()? != 0,
                    mapped: r.u64()?,
                    labels: Vec::new(),
                };
                s.labels = read_labels(&mut r)?;
                Record::Snapshot(s)
            }
            KIND_RETIRED => Record::Retired(RetiredRec {
                id: r.u64()?,
                name: r.str()?,
                size: r.u64()?,
                created: r.u64()?,
                deleted: r.u64()?,
                labels: read_labels(&mut r)?,
            }),
            k => return Err(Error::corrupt(block, format!("unknown record kind {k}"))),
        };
        Ok(rec)
    }
}

/// The naming rule for volumes and snapshots, checked the same way everywhere.
pub const NAME_RULE: &str = "a name is 1 to 255 characters of lowercase letters, digits, '-', '_' and '.', starting with a letter or digit";
/// The longest name [`check_name`] accepts, in bytes (all ASCII).
pub const NAME_MAX_LEN: usize = 255;
/// [`check_name`]'s character rule as a regular expression (ECMA-262, as
/// JSON Schema reads it; the length is [`NAME_MAX_LEN`]): what the API's
/// schema declares.
pub const NAME_PATTERN: &str = "^[a-z0-9][a-z0-9._-]*$";

pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX_LEN
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-_.".contains(&c))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(64).collect();
        Err(Error::InvalidName {
            name: if name.len() > 64 {
                format!("{shown}...")
            } else {
                shown
            },
            rule: NAME_RULE,
        })
    }
}

/// [`check_volume_reference`]'s rule as a regular expression (the name's
/// length is [`NAME_MAX_LEN`]; the id a decimal `u64`): what the API's
/// schema declares for a snapshot path's volume.
pub const VOLUME_REFERENCE_PATTERN: &str = "^[a-z0-9][a-z0-9._-]*(@[0-9]+)?$";

/// A reference to a volume whose snapshots are named: a name, or
/// `NAME@ID` (a live or deleted volume by its pool id; see
/// `Pool::list_snapshots`).
pub fn check_volume_reference(reference: &str) -> Result<()> {
    match reference.rsplit_once('@') {
        Some((name, id)) => {
            check_name(name)?;
            if id.is_empty()
                || !id.bytes().all(|c| c.is_ascii_digit())
                || id.parse::<u64>().is_err()
            {
                return Err(Error::InvalidArgument(format!(
                    "{reference:?}: a volume is named NAME or NAME@ID, ID its pool id in decimal"
                )));
            }
            Ok(())
        }
        None => check_name(reference),
    }
}

/// The longest label key, in bytes (UTF-8).
pub const LABEL_KEY_MAX_LEN: usize = 255;
/// The longest label value, in bytes (UTF-8).
pub const LABEL_VALUE_MAX_LEN: usize = 1024;
/// What a volume's or snapshot's labels may take in all: each key and
/// value, plus [`LABEL_OVERHEAD`] bytes a label.
pub const LABELS_MAX_BYTES: usize = 2048;
/// Bytes counted for each label besides its key and value.
pub const LABEL_OVERHEAD: usize = 4;
/// [`check_labels`]'s character rule for keys and values (no control
/// characters, Unicode category Cc) as an ECMA-262 regular expression.
pub const LABEL_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// Labels: keys 1-255 bytes, values up to 1024 bytes, no control characters,
/// at most 2,048 bytes in all so a snapshot record always fits a page.
pub fn check_labels(labels: &[(String, String)]) -> Result<()> {
    let mut total = 0;
    for (k, v) in labels {
        if k.is_empty()
            || k.len() > LABEL_KEY_MAX_LEN
            || v.len() > LABEL_VALUE_MAX_LEN
            || k.chars().chain(v.chars()).any(char::is_control)
        {
            return Err(Error::InvalidArgument(format!(
                "label {k:?}: keys are 1-{LABEL_KEY_MAX_LEN} bytes, values up to {LABEL_VALUE_MAX_LEN}, no control characters"
            )));
        }
        total += k.len() + v.len() + LABEL_OVERHEAD;
    }
    if total > LABELS_MAX_BYTES {
        return Err(Error::InvalidArgument(format!(
            "labels take {total} bytes; at most {LABELS_MAX_BYTES} are allowed"
        )));
    }
    let mut keys: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::InvalidArgument("a label key appears twice".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry() {
        assert_eq!(FANOUT, 504);
        assert_eq!(GROUP, 1008);
        assert!(is_system_block(0) && is_system_block(1) && is_system_block(GROUP + 1));
        assert!(!is_system_block(GROUP) && !is_system_block(2));
        assert_eq!(rc_page_of(GROUP * 3 + 17), GROUP * 3 + 1);
    }

    #[test]
    fn seal_and_verify_detect_damage() {
        let mut p = new_page();
        node::init(&mut p, 2);
        node::set_entry(&mut p, 7, 99);
        seal(&mut p, 42, 5);
        verify(&p, 42, MAGIC_NODE).unwrap();
        assert!(verify(&p, 43, MAGIC_NODE).is_err(), "misdirected");
        assert!(verify(&p, 42, MAGIC_RC).is_err(), "wrong kind");
        p[HEADER + 100] ^= 1;
        assert!(verify(&p, 42, MAGIC_NODE).is_err(), "bit flip");
    }

    #[test]
    fn records_round_trip() {
        let recs = [
            Record::Volume(VolumeRec {
                id: 3,
                name: "a".repeat(255),
                size: 1 << 40,
                root: 77,
                levels: 4,
                created: 123,
                parent: 9,
                mapped: 5,
                origin: Some(Origin {
                    volume: 1,
                    snapshot: 2,
                    root: 3,
                    levels: 1,
                }),
                flattening: true,
                labels: vec![],
            }),
            Record::Volume(VolumeRec {
                id: 5,
                name: "v".into(),
                size: 4096,
                root: 0,
                levels: 1,
                created: 1,
                parent: 0,
                mapped: 0,
                origin: None,
                flattening: false,
                labels: vec![("app".into(), "db".into()), ("tier".into(), "gold".into())],
            }),
            Record::Snapshot(SnapshotRec {
                id: 4,
                volume: 3,
                name: "s".into(),
                size: 4096,
                root: 0,
                levels: 1,
                created: 1,
                parent: 0,
                system: true,
                mapped: 0,
                labels: vec![("k".into(), "v".repeat(1000))],
            }),
            Record::Retired(RetiredRec {
                id: 6,
                name: "r".repeat(255),
                size: 1 << 30,
                created: 2,
                deleted: 3,
                labels: vec![("app".into(), "db".into())],
            }),
        ];
        for r in recs {
            let mut p = new_page();
            r.encode(&mut p).unwrap();
            seal(&mut p, 10, 1);
            assert_eq!(Record::decode(&p, 10).unwrap(), r);
        }
    }

    #[test]
    fn a_volume_without_labels_is_written_as_before_labels() {
        let mut v = VolumeRec {
            id: 5,
            name: "v".into(),
            size: 4096,
            root: 0,
            levels: 1,
            created: 1,
            parent: 0,
            mapped: 0,
            origin: None,
            flattening: false,
            labels: vec![],
        };
        let mut p = new_page();
        Record::Volume(v.clone()).encode(&mut p).unwrap();
        assert_eq!(p[HEADER + 1], RECORD_VERSION);
        v.labels.push(("k".into(), "v".into()));
        Record::Volume(v).encode(&mut p).unwrap();
        assert_eq!(p[HEADER + 1], RECORD_VERSION_LABELS);
        // A snapshot record never claims version 2.
        p[HEADER] = KIND_SNAPSHOT;
        seal(&mut p, 10, 1);
        assert!(Record::decode(&p, 10).is_err());
    }

    #[test]
    fn names() {
        check_name("a").unwrap();
        check_name(&"a".repeat(255)).unwrap();
        check_name("0vol-1_x.y").unwrap();
        for bad in ["", "-a", ".a", "A", "a b", "é", &"a".repeat(256)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
