//! Layout 4: a partition's state as a *section* — a JSON header (watermark, open windows, per
//! dedup its runs of keys) and the blocks of key entries this write added — and the *state
//! file* holding the sections of every partition one batch touched, zstd-compressed as one
//! frame (the partitions' headers name the same files and compress into little).
//!
//! Section: `ST\x04`, the JSON header's length (u32) and the header, the number of blocks (u32),
//! then per block its entry count (u64) and the entries, each the key's hash (u128) and its
//! first event time (i64). State file: `STF\x04`, the number of sections (u32), then per
//! section its partition (u16 length + UTF-8 `topic/partition`), its length (u64) and its
//! bytes. Integers are little-endian. A run stored in the file its section is in names no file
//! (the file's name is its content's hash); when read, it takes the file's location.
//!
//! After the sections, a file may carry *rows*: small derived-table files (a window's partial
//! rows) that the batch did not write as objects of their own — the commit stage writes them
//! into its table (see `checkpoint::CarriedRows` in the model): `RW\x01`, the number of parts (u32),
//! then per part its length (u64) and its bytes (a Parquet file). Readers of the state stop
//! after the sections, so releases that do not know rows read such a file's state unchanged.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::keys::{Entry, Run, RunRef, time_range};
use super::{OpenWindow, PartitionState, PlanSig, TableState, is_zero};
use crate::error::{Error, Result};

/// The layout this module writes.
pub const VERSION: u32 = 4;

/// What a section starts with.
pub(super) const SECTION_MAGIC: &[u8; 3] = b"ST\x04";

/// What a state file starts with (decompressed).
const FILE_MAGIC: &[u8; 4] = b"STF\x04";

/// What the rows after the sections start with.
const ROWS_MAGIC: &[u8; 3] = b"RW\x01";

/// Most bytes of rows one state file carries (all parts together).
pub const MAX_CARRIED_BYTES: usize = 256 * 1024;

/// Most parts of rows one state file carries.
const MAX_CARRIED_PARTS: u32 = 4096;

/// Bytes of one stored key entry.
pub(super) const ENTRY_BYTES: usize = 24;

#[derive(Serialize, Deserialize)]
struct Header {
    v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_event_time: Option<i64>,
    #[serde(default)]
    updated_at_ms: i64,
    #[serde(default)]
    tables: BTreeMap<String, HeaderTable>,
}

#[derive(Serialize, Deserialize)]
struct HeaderTable {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plan: Option<PlanSig>,
    #[serde(default, skip_serializing_if = "is_zero")]
    written_at_ms: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    open: Vec<OpenWindow>,
    /// Oldest first: `[file, block, count, min_t, max_t, merged, horizon]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    runs: Vec<(String, u32, u64, i64, i64, bool, i64)>,
    /// The horizon the dedup last expired runs by, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    horizon: Option<i64>,
}

/// A partition's state sealed for writing.
#[derive(Debug, Clone)]
pub struct SealedSection {
    /// The section's bytes.
    pub bytes: Vec<u8>,
    /// Whether it carries blocks (then it must be stored in a state file, never inline).
    pub has_blocks: bool,
    /// Key entries its blocks hold.
    pub entries: u64,
}

impl PartitionState {
    /// Turns every dedup's fresh keys into a run — merged with its young runs into a segment
    /// when [`super::Keys::merge_plan`] says so (`within_us` gives a table's bound, `None` for a
    /// table the plan does not know) — and encodes the section. The new runs name no file until
    /// [`PartitionState::placed`].
    pub fn seal(&mut self, within_us: impl Fn(&str) -> Option<u64>) -> Result<SealedSection> {
        let mut blocks: Vec<Arc<Vec<Entry>>> = Vec::new();
        for (name, t) in &mut self.tables {
            seal_table(name, t, within_us(name), &mut blocks)?;
        }
        let header = Header {
            v: VERSION,
            max_event_time: self.max_event_time,
            updated_at_ms: self.updated_at_ms,
            tables: self
                .tables
                .iter()
                .map(|(name, t)| {
                    (
                        name.clone(),
                        HeaderTable {
                            plan: t.plan.clone(),
                            written_at_ms: t.written_at_ms,
                            open: t.open.clone(),
                            runs: t
                                .keys
                                .runs
                                .iter()
                                .map(|r| {
                                    let a = &r.at;
                                    (
                                        a.file.clone(),
                                        a.block,
                                        a.count,
                                        a.min_t,
                                        a.max_t,
                                        a.merged,
                                        a.horizon,
                                    )
                                })
                                .collect(),
                            horizon: (t.keys.horizon != i64::MIN).then_some(t.keys.horizon),
                        },
                    )
                })
                .collect(),
        };
        let json = serde_json::to_vec(&header)
            .map_err(|e| Error::Internal(format!("serialize partition state: {e}")))?;
        let entries: usize = blocks.iter().map(|b| b.len()).sum();
        let mut out = Vec::with_capacity(json.len() + 16 + entries * ENTRY_BYTES);
        out.extend(SECTION_MAGIC);
        out.extend(u32_of(json.len(), "partition state header")?.to_le_bytes());
        out.extend(json);
        out.extend(u32_of(blocks.len(), "blocks of a partition state")?.to_le_bytes());
        for b in &blocks {
            out.extend((b.len() as u64).to_le_bytes());
            for (h, t) in b.iter() {
                out.extend(h.to_le_bytes());
                out.extend(t.to_le_bytes());
            }
        }
        Ok(SealedSection {
            bytes: out,
            has_blocks: !blocks.is_empty(),
            entries: entries as u64,
        })
    }

    /// The section was stored in the state file at `location`: its new runs name it.
    pub fn placed(&mut self, location: &str) {
        for t in self.tables.values_mut() {
            for r in &mut t.keys.runs {
                if r.at.file.is_empty() {
                    r.at.file = location.to_string();
                }
            }
        }
    }

    /// The state files its runs are stored in (for clean-up: these are in use).
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.tables
            .values()
            .flat_map(|t| t.keys.runs.iter().map(|r| r.at.file.as_str()))
            .filter(|f| !f.is_empty())
    }
}

/// Seals one table's fresh keys into a block of `blocks`.
fn seal_table(
    _name: &str,
    t: &mut TableState,
    within_us: Option<u64>,
    blocks: &mut Vec<Arc<Vec<Entry>>>,
) -> Result<()> {
    let keys = &mut t.keys;
    let over = keys.runs.len() > super::keys::MAX_RUNS;
    if keys.fresh.is_empty() && !over {
        return Ok(());
    }
    // A merge needs every run it merges in memory (a state read for its windows only, by the
    // idle flush, has none): without them the fresh keys are a run of their own.
    let plan = match (keys.migrated, within_us) {
        (false, Some(w)) => keys
            .merge_plan(w)
            .and_then(|range| keys.merged(range.clone(), w).map(|m| (range, m))),
        _ => None,
    };
    let (range, entries, until, merged) = match plan {
        Some((range, (entries, until))) => (range, entries, until, true),
        None => {
            if keys.fresh.is_empty() {
                return Ok(());
            }
            let n = keys.runs.len();
            let until = keys.hides_until;
            (n..n, std::mem::take(&mut keys.fresh), until, keys.migrated)
        }
    };
    keys.fresh.clear();
    keys.migrated = false;
    keys.hides_until = None;
    if entries.is_empty() {
        keys.runs.drain(range);
        return Ok(());
    }
    let (min_t, max_t) = time_range(&entries);
    let max_t = until.map_or(max_t, |u| u.max(max_t));
    let block = u32_of(blocks.len(), "blocks of a partition state")?;
    let entries = Arc::new(entries);
    blocks.push(entries.clone());
    keys.runs.splice(
        range,
        [Run {
            at: RunRef {
                file: String::new(),
                block,
                count: entries.len() as u64,
                min_t,
                max_t,
                merged,
                horizon: keys.horizon,
            },
            entries: Some(entries),
            filter: Default::default(),
        }],
    );
    Ok(())
}

fn u32_of(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Internal(format!("{what}: over 4 GB")))
}

/// Reads a section (decompressed); its runs without a file are in `location` (empty for a
/// state stored inline, which has no blocks).
pub(super) fn decode_section(raw: &[u8], location: &str, what: &str) -> Result<PartitionState> {
    let bad = |m: &str| Error::Internal(format!("{what}: state is damaged ({m})"));
    let mut rest = raw
        .strip_prefix(SECTION_MAGIC)
        .ok_or_else(|| bad("magic"))?;
    let len = take_u32(&mut rest).ok_or_else(|| bad("header length"))? as usize;
    let (json, mut rest) = rest.split_at_checked(len).ok_or_else(|| bad("header"))?;
    let header: Header = serde_json::from_slice(json)
        .map_err(|e| Error::Internal(format!("{what}: state cannot be read: {e}")))?;
    if header.v > VERSION {
        return Err(Error::Internal(format!(
            "{what}: state of layout {} was written by a newer release (this one reads up to {VERSION}); deploy that release",
            header.v
        )));
    }
    let count = take_u32(&mut rest).ok_or_else(|| bad("blocks"))?;
    let mut blocks: Vec<Arc<Vec<Entry>>> = Vec::new();
    for _ in 0..count {
        let n = take_u64(&mut rest).ok_or_else(|| bad("block length"))?;
        let n = usize::try_from(n)
            .ok()
            .filter(|n| n.checked_mul(ENTRY_BYTES).is_some_and(|b| b <= rest.len()))
            .ok_or_else(|| bad("block"))?;
        let (body, tail) = rest.split_at(n * ENTRY_BYTES);
        rest = tail;
        let entries: Vec<Entry> = body
            .chunks_exact(ENTRY_BYTES)
            .map(|c| {
                let mut h = [0u8; 16];
                let mut t = [0u8; 8];
                h.copy_from_slice(&c[..16]);
                t.copy_from_slice(&c[16..]);
                (u128::from_le_bytes(h), i64::from_le_bytes(t))
            })
            .collect();
        if !entries.is_sorted_by(|a, b| a.0 < b.0) {
            return Err(bad("a block is not sorted"));
        }
        blocks.push(Arc::new(entries));
    }
    let mut tables = BTreeMap::new();
    for (name, t) in header.tables {
        let mut runs = Vec::with_capacity(t.runs.len());
        for (file, block, count, min_t, max_t, merged, horizon) in t.runs {
            if min_t > max_t {
                return Err(bad("a run's time range is reversed"));
            }
            let (file, entries) = if file.is_empty() {
                if location.is_empty() {
                    return Err(bad("a state kept in its item names a block"));
                }
                let b = blocks
                    .get(block as usize)
                    .filter(|b| b.len() as u64 == count)
                    .ok_or_else(|| bad("a run names a block it lacks"))?;
                (location.to_string(), Some(b.clone()))
            } else {
                (file, None)
            };
            runs.push(Run {
                at: RunRef {
                    file,
                    block,
                    count,
                    min_t,
                    max_t,
                    merged,
                    horizon,
                },
                entries,
                filter: Default::default(),
            });
        }
        tables.insert(
            name,
            TableState {
                plan: t.plan,
                written_at_ms: t.written_at_ms,
                open: t.open,
                keys: super::Keys {
                    runs,
                    horizon: t.horizon.unwrap_or(i64::MIN),
                    ..Default::default()
                },
            },
        );
    }
    Ok(PartitionState {
        v: header.v,
        max_event_time: header.max_event_time,
        updated_at_ms: header.updated_at_ms,
        tables,
    })
}

/// Sections of a batch's partitions, put together into one state file.
#[derive(Debug, Default)]
pub struct StateFile {
    raw: Vec<u8>,
    sections: u32,
    rows: Vec<bytes::Bytes>,
}

impl StateFile {
    /// Adds partition `key`'s (`topic/partition`) section.
    pub fn add(&mut self, key: &str, section: &SealedSection) -> Result<()> {
        if self.raw.is_empty() {
            self.raw.extend(FILE_MAGIC);
            self.raw.extend(0u32.to_le_bytes());
        }
        let len = u16::try_from(key.len())
            .map_err(|_| Error::Internal(format!("partition name {key:?} is too long")))?;
        self.raw.extend(len.to_le_bytes());
        self.raw.extend(key.as_bytes());
        self.raw.extend((section.bytes.len() as u64).to_le_bytes());
        self.raw.extend(&section.bytes);
        self.sections += 1;
        self.raw[4..8].copy_from_slice(&self.sections.to_le_bytes());
        Ok(())
    }

    /// Whether no section was added.
    pub fn is_empty(&self) -> bool {
        self.sections == 0
    }

    /// Carries `rows` (a Parquet file's bytes) after the sections; returns its part number.
    pub fn add_rows(&mut self, rows: bytes::Bytes) -> u32 {
        self.rows.push(rows);
        (self.rows.len() - 1) as u32
    }

    /// The file's bytes (compressed) and the hash its name carries (hex, 128 bits).
    pub fn finish(mut self) -> Result<(Vec<u8>, String)> {
        if !self.rows.is_empty() {
            if self.raw.is_empty() {
                return Err(Error::Internal(
                    "a state file carries rows but holds no section".into(),
                ));
            }
            self.raw.extend(ROWS_MAGIC);
            self.raw
                .extend(u32_of(self.rows.len(), "carried parts")?.to_le_bytes());
            for part in &self.rows {
                self.raw.extend((part.len() as u64).to_le_bytes());
                self.raw.extend(part.iter());
            }
        }
        let bytes = zstd::bulk::compress(&self.raw, 1)
            .map_err(|e| Error::Internal(format!("compress state file: {e}")))?;
        let hash = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes));
        Ok((bytes, hash))
    }
}

/// Every section of the state file at `location` (its bytes), by partition (`topic/partition`).
pub fn decode_file(bytes: &[u8], location: &str) -> Result<BTreeMap<String, PartitionState>> {
    let what = format!("state file {location}");
    let raw = super::unzstd(bytes, &what)?;
    let (sections, _) = sections(&raw, &what)?;
    let mut out = BTreeMap::new();
    for (key, section) in sections {
        let state = decode_section(section, location, &format!("{what}, partition {key}"))?;
        out.insert(key.to_string(), state);
    }
    Ok(out)
}

/// The rows the state file at `location` (its bytes) carries after its sections, by part
/// number: none in a file written without them.
pub fn decode_rows(bytes: &[u8], location: &str) -> Result<Vec<bytes::Bytes>> {
    let what = format!("state file {location}");
    let bad = |m: &str| Error::Internal(format!("{what}: damaged ({m})"));
    let raw = super::unzstd(bytes, &what)?;
    let (_, mut rest) = sections(&raw, &what)?;
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    rest = rest.strip_prefix(ROWS_MAGIC).ok_or_else(|| bad("rows"))?;
    let count = take_u32(&mut rest)
        .filter(|n| *n <= MAX_CARRIED_PARTS)
        .ok_or_else(|| bad("rows count"))?;
    let mut parts = Vec::new();
    let mut total = 0usize;
    for _ in 0..count {
        let n = take_u64(&mut rest)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| bad("rows length"))?;
        total = total.saturating_add(n);
        if total > MAX_CARRIED_BYTES {
            return Err(bad(&format!(
                "more rows than a batch carries ({} KB)",
                MAX_CARRIED_BYTES >> 10
            )));
        }
        let (part, tail) = rest.split_at_checked(n).ok_or_else(|| bad("rows"))?;
        rest = tail;
        parts.push(bytes::Bytes::copy_from_slice(part));
    }
    Ok(parts)
}

/// A state file's sections as (partition, bytes), and what follows them.
type Sections<'a> = (Vec<(&'a str, &'a [u8])>, &'a [u8]);

/// A decompressed state file's sections (partition, bytes) and what follows them.
fn sections<'a>(raw: &'a [u8], what: &str) -> Result<Sections<'a>> {
    let bad = |m: &str| Error::Internal(format!("{what}: damaged ({m})"));
    let mut rest = raw.strip_prefix(FILE_MAGIC).ok_or_else(|| bad("magic"))?;
    let count = take_u32(&mut rest).ok_or_else(|| bad("count"))?;
    let mut out = Vec::new();
    for _ in 0..count {
        let [a, b] = take::<2>(&mut rest).ok_or_else(|| bad("partition"))?;
        let len = usize::from(u16::from_le_bytes([a, b]));
        let (key, tail) = rest.split_at_checked(len).ok_or_else(|| bad("partition"))?;
        rest = tail;
        let key = std::str::from_utf8(key).map_err(|_| bad("partition"))?;
        let n = take_u64(&mut rest)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| bad("section length"))?;
        let (section, tail) = rest.split_at_checked(n).ok_or_else(|| bad("section"))?;
        rest = tail;
        out.push((key, section));
    }
    Ok((out, rest))
}

/// A state stored in its item (layout 4 inline, or 1–3).
pub fn decode_inline(bytes: &[u8], what: &str) -> Result<PartitionState> {
    PartitionState::decode(bytes, what)
}

fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

fn take_u32(bytes: &mut &[u8]) -> Option<u32> {
    take::<4>(bytes).map(u32::from_le_bytes)
}

fn take_u64(bytes: &mut &[u8]) -> Option<u64> {
    take::<8>(bytes).map(u64::from_le_bytes)
}
