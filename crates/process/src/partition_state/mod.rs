//! The state of stateful derived tables in one Kafka partition — the watermark, each windowed
//! table's open windows, each dedup's keys — as it is stored with the partition's checkpoint
//! (see [`crate::partition_state::StoredState`]).
//!
//! Layout 4 (`file.rs`): a partition's *section* — a JSON header (watermark, open windows, and
//! per dedup the runs of keys it remembers, `keys.rs`) followed by the blocks of key entries this
//! write added — stored in a state file that holds the sections of every partition one batch
//! touched (one object per batch), or inline in the state item when it adds no block. Layouts
//! 1–3 (the whole state rewritten on every batch: JSON, then a JSON header and packed keys,
//! `seen.rs`) are still read; their keys are hashed and stored as one segment by the next write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::value::Value;
use crate::error::{Error, Result};

mod compat;
mod file;
pub mod keys;
mod seen;

pub use compat::{Adoption, PlanSig, StateChanges, adopt};
pub use file::{
    MAX_CARRIED_BYTES, SealedSection, StateFile, decode_file, decode_inline, decode_rows,
};
pub use keys::Keys;

/// The newest layout of the earlier, whole-state form (read, never written).
const LEGACY_VERSION: u32 = 3;

/// What layouts 2 and 3 start with (layout 1 is JSON: `{`).
const MAGIC: &[u8; 3] = b"ST\x02";

/// Everything the derived tables of one topic keep about one of its partitions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionState {
    /// Layout version it was read in (0: new).
    pub v: u32,
    /// The highest event time the partition has carried, µs (the watermark is this minus the
    /// table's out-of-orderness).
    pub max_event_time: Option<i64>,
    /// When records last landed in the partition, epoch ms (idle detection).
    pub updated_at_ms: i64,
    /// Per derived table.
    pub tables: BTreeMap<String, TableState>,
}

/// One derived table's state in one partition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableState {
    /// What the plan that wrote this state keeps in it (`None`: a release before plans were
    /// recorded), so that a changed SQL is carried over, restarted, or refused — never misread.
    pub plan: Option<PlanSig>,
    /// When a plan that knows this table last wrote its state, epoch ms. A release that does
    /// not know the table (a rolling deploy, an older container) keeps the state as it is.
    pub written_at_ms: i64,
    /// Open windows, by start and key.
    pub open: Vec<OpenWindow>,
    /// Dedup keys still inside their bound.
    pub keys: Keys,
}

/// A window and key still open in a partition, with its accumulators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenWindow {
    /// Window start, µs since the epoch.
    pub start: i64,
    /// A session window's end, µs (its last event time plus the gap); tumbling and hopping
    /// windows end at `start` plus their size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<i64>,
    /// The `GROUP BY` keys' values.
    pub key: Vec<Value>,
    /// One per aggregate.
    pub accs: Vec<Acc>,
}

/// A windowed table's open windows in one partition.
pub type WindowState = Vec<OpenWindow>;

/// One aggregate's state in one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Acc {
    /// `count(*)` / `count(x)`.
    Count(i64),
    /// `sum` of integers or decimals (unscaled); `None` until a non-NULL value.
    SumInt(Option<i128>),
    /// `sum` of floats, as `f64` bits.
    SumFloat(Option<u64>),
    /// `min`: the least value so far (`Null` until a non-NULL value).
    Min(Value),
    /// `max`: the greatest value so far.
    Max(Value),
    /// `avg`: sum (`f64` bits) and count of non-NULL values.
    Avg {
        /// Sum, `f64` bits.
        sum: u64,
        /// Non-NULL values.
        count: i64,
    },
    /// `approx_distinct`: a HyperLogLog sketch of the non-NULL values.
    Distinct(super::sketch::Sketch),
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// A state of layouts 1–3 as stored (`seen` packed after the JSON in 2 and 3).
#[derive(Debug, Default, Serialize, Deserialize)]
struct LegacyState {
    #[serde(default)]
    v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_event_time: Option<i64>,
    #[serde(default)]
    updated_at_ms: i64,
    #[serde(default)]
    tables: BTreeMap<String, LegacyTable>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LegacyTable {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plan: Option<PlanSig>,
    #[serde(default, skip_serializing_if = "is_zero")]
    written_at_ms: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    open: Vec<OpenWindow>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    seen: Vec<(Vec<Value>, i64)>,
}

impl PartitionState {
    /// Reads a state stored in the item itself: layout 4 inline (no blocks), or layouts 1–3;
    /// `what` names it in errors.
    pub fn decode(bytes: &[u8], what: &str) -> Result<PartitionState> {
        let raw = unzstd(bytes, &format!("{what}: state"))?;
        if raw.starts_with(file::SECTION_MAGIC) {
            return file::decode_section(&raw, "", what);
        }
        decode_legacy(&raw, what)
    }

    /// Encoded bytes a state would take on its own (what `bench` and the summary report as a
    /// partition's size): its header and every key entry.
    pub fn stored_bytes(&self) -> u64 {
        let keys = self
            .tables
            .values()
            .fold(0u64, |n, t| n.saturating_add(t.keys.len()));
        let open: usize = self.tables.values().map(|t| t.open.len()).sum();
        keys.saturating_mul(file::ENTRY_BYTES as u64)
            .saturating_add(open as u64 * 64)
    }
}

/// The most a stored state or state file may decompress to.
const MAX_DECOMPRESSED_BYTES: u64 = 512 << 20;

/// `bytes` decompressed (zstd), at most [`MAX_DECOMPRESSED_BYTES`]; `what` names them.
fn unzstd(bytes: &[u8], what: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let decoder = zstd::stream::read::Decoder::new(bytes)
        .map_err(|e| Error::Internal(format!("{what} is not zstd: {e}")))?;
    let mut out = Vec::new();
    decoder
        .take(MAX_DECOMPRESSED_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::Internal(format!("{what} is not zstd: {e}")))?;
    if out.len() as u64 > MAX_DECOMPRESSED_BYTES {
        return Err(Error::Internal(format!(
            "{what} decompresses to more than {} MB: damaged",
            MAX_DECOMPRESSED_BYTES >> 20
        )));
    }
    Ok(out)
}

/// Layouts 1–3, decompressed.
fn decode_legacy(raw: &[u8], what: &str) -> Result<PartitionState> {
    let (json, packed) = match raw.strip_prefix(MAGIC) {
        Some(rest) => {
            let (len, rest) = rest
                .split_first_chunk::<4>()
                .ok_or_else(|| Error::Internal(format!("{what}: state is cut short")))?;
            let len = u32::from_le_bytes(*len) as usize;
            rest.split_at_checked(len)
                .ok_or_else(|| Error::Internal(format!("{what}: state is cut short")))?
        }
        None => (raw, &[][..]),
    };
    let mut s: LegacyState = serde_json::from_slice(json)
        .map_err(|e| Error::Internal(format!("{what}: state cannot be read: {e}")))?;
    if s.v > LEGACY_VERSION {
        return Err(Error::Internal(format!(
            "{what}: state of layout {} was written by a newer release (this one reads up to {}); deploy that release",
            s.v,
            file::VERSION
        )));
    }
    for (name, keys) in seen::unpack(packed, what)? {
        s.tables.entry(name).or_default().seen = keys;
    }
    Ok(PartitionState {
        v: s.v,
        max_event_time: s.max_event_time,
        updated_at_ms: s.updated_at_ms,
        tables: s
            .tables
            .into_iter()
            .map(|(name, t)| {
                (
                    name,
                    TableState {
                        plan: t.plan,
                        written_at_ms: t.written_at_ms,
                        open: t.open,
                        keys: Keys::migrate(&t.seen),
                    },
                )
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> OpenWindow {
        OpenWindow {
            end: None,
            start: 60_000_000,
            key: vec![Value::Str("DE".into())],
            accs: vec![
                Acc::Count(3),
                Acc::SumInt(Some(i128::MAX)),
                Acc::Avg {
                    sum: f64::NAN.to_bits(),
                    count: 1,
                },
                Acc::Distinct(crate::sketch::Sketch::of(&[
                    Value::Str("c-1".into()),
                    Value::Str("c-2".into()),
                ])),
            ],
        }
    }

    #[test]
    fn sections_round_trip_through_a_state_file_and_inline() {
        let mut s = PartitionState {
            max_event_time: Some(1_700_000_000_000_000),
            updated_at_ms: 5,
            ..Default::default()
        };
        let mut t = TableState {
            open: vec![window()],
            ..Default::default()
        };
        t.keys.add(vec![(1, 10), (7, 20)]);
        s.tables.insert("orders_per_minute".into(), t);
        let sealed = s.seal(|_| Some(3_600_000_000)).unwrap();
        assert!(sealed.has_blocks);
        assert_eq!(sealed.entries, 2);
        let mut file = StateFile::default();
        file.add("orders/0", &sealed).unwrap();
        let (bytes, hash) = file.finish().unwrap();
        let location = format!("w/_state/partitions/orders/runs/{hash}.run");
        s.placed(&location);
        let back = decode_file(&bytes, &location).unwrap();
        let back = &back["orders/0"];
        assert_eq!(
            back.tables, s.tables,
            "the sealed run, named by the file, with its entries"
        );
        assert_eq!(back.max_event_time, s.max_event_time);
        assert_eq!(back.tables["orders_per_minute"].keys.get(7), Some(20));
        assert_eq!(back.files().collect::<Vec<_>>(), vec![location.as_str()]);
        // The next write adds nothing: no block, stored inline, its run still named.
        let mut next = back.clone();
        let sealed = next.seal(|_| Some(3_600_000_000)).unwrap();
        assert!(!sealed.has_blocks);
        let inline = zstd::bulk::compress(&sealed.bytes, 1).unwrap();
        let read = PartitionState::decode(&inline, "p").unwrap();
        let keys = &read.tables["orders_per_minute"].keys;
        assert_eq!(keys.runs[0].at.file, location);
        assert!(
            keys.runs[0].entries.is_none(),
            "loaded from its file when needed"
        );
        // Damage is an error naming the state, never a panic.
        let e = decode_file(&bytes[..bytes.len() / 2], &location).unwrap_err();
        assert!(e.to_string().contains(&location), "{e}");
    }

    #[test]
    fn a_state_file_carries_rows_after_its_sections_and_its_state_reads_unchanged() {
        let mut s = PartitionState {
            max_event_time: Some(1_700_000_000_000_000),
            ..Default::default()
        };
        let mut t = TableState::default();
        t.keys.add(vec![(3, 30)]);
        s.tables.insert("orders_clean".into(), t);
        let sealed = s.seal(|_| Some(3_600_000_000)).unwrap();
        let file_of = |rows: &[&'static [u8]]| {
            let mut file = StateFile::default();
            file.add("orders/0", &sealed).unwrap();
            for (i, r) in rows.iter().enumerate() {
                assert_eq!(file.add_rows(bytes::Bytes::from_static(r)), i as u32);
            }
            file.finish().unwrap().0
        };
        let (plain, carrying) = (file_of(&[]), file_of(&[b"PAR1 one", b"", b"PAR1 three"]));
        let location = "w/_state/partitions/orders/runs/x.run";
        // The state is what a file without rows holds: releases that do not know rows stop
        // reading after the sections.
        assert_eq!(
            decode_file(&carrying, location).unwrap()["orders/0"].tables,
            decode_file(&plain, location).unwrap()["orders/0"].tables
        );
        let parts = decode_rows(&carrying, location).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.as_ref()).collect::<Vec<_>>(),
            vec![&b"PAR1 one"[..], b"", b"PAR1 three"]
        );
        assert!(decode_rows(&plain, location).unwrap().is_empty());
        // Rows without a section are refused; damaged rows are an error naming the file.
        let mut empty = StateFile::default();
        empty.add_rows(bytes::Bytes::from_static(b"x"));
        assert!(empty.finish().is_err());
        let raw = unzstd(&carrying, "t").unwrap();
        for cut in [raw.len() - 1, raw.len() - 12] {
            let damaged = zstd::bulk::compress(&raw[..cut], 1).unwrap();
            let e = decode_rows(&damaged, location).unwrap_err();
            assert!(e.to_string().contains(location), "{e}");
        }
        // A forged rows part that would inflate (millions of empty parts, or parts past what a
        // batch carries) is refused before anything is allocated for it.
        let at = raw.len() - (3 + 4 + 3 * 8 + 8 + 10);
        let mut forged = raw[..at].to_vec();
        forged.extend(b"RW\x01");
        forged.extend(u32::MAX.to_le_bytes());
        forged.extend(vec![0u8; 1 << 20]);
        let e = decode_rows(&zstd::bulk::compress(&forged, 1).unwrap(), location).unwrap_err();
        assert!(e.to_string().contains("rows count"), "{e}");
        let mut forged = raw[..at].to_vec();
        forged.extend(b"RW\x01");
        forged.extend(2u32.to_le_bytes());
        forged.extend((MAX_CARRIED_BYTES as u64).to_le_bytes());
        forged.extend(vec![7u8; MAX_CARRIED_BYTES]);
        forged.extend(1u64.to_le_bytes());
        forged.push(7);
        let e = decode_rows(&zstd::bulk::compress(&forged, 1).unwrap(), location).unwrap_err();
        assert!(
            e.to_string().contains("more rows than a batch carries"),
            "{e}"
        );
    }

    #[test]
    fn a_state_of_the_previous_layout_is_read_and_its_keys_migrated() {
        // Written by the release before layout 4: orders/0 after one batch of 40 orders
        // (`ord-0000000000` … `ord-0000000039`), dedup by order_id, the 1-minute window open.
        let bytes = include_bytes!("testdata/layout3-orders-0.zst");
        let s = PartitionState::decode(bytes, "orders/0").unwrap();
        assert_eq!(s.v, 3);
        let clean = &s.tables["orders_clean"];
        assert_eq!(clean.keys.len(), 40);
        assert!(clean.keys.migrated, "stored as a segment by the next write");
        let mut scratch = Vec::new();
        let mut hash =
            |id: &str| keys::hash_key([crate::value::ValueRef::Str(id)].into_iter(), &mut scratch);
        assert!(clean.keys.get(hash("ord-0000000000")).is_some());
        assert!(clean.keys.get(hash("ord-0000000039")).is_some());
        assert!(clean.keys.get(hash("ord-0000000040")).is_none());
        let windows = &s.tables["orders_per_minute_partials"];
        assert!(!windows.open.is_empty());
        assert!(windows.plan.is_some());
        // The next write stores the keys as one segment.
        let mut s = s;
        let sealed = s.seal(|_| Some(3_600_000_000)).unwrap();
        assert_eq!(sealed.entries, 40);
        assert!(s.tables["orders_clean"].keys.runs[0].at.merged);
    }

    #[test]
    fn layout_one_and_damaged_or_newer_states() {
        // Layout 1: the whole state as JSON, keys in no particular order.
        let v1 = format!(
            r#"{{"v": 1, "max_event_time": 9, "updated_at_ms": 5, "tables": {{"t": {{
                "seen": [[[{{"Str": "o-2"}}], 9], [[{{"Str": "o-1"}}], 7]], "open": [{}]}}}}}}"#,
            serde_json::to_string(&window()).unwrap()
        );
        let old = zstd::bulk::compress(v1.as_bytes(), 1).unwrap();
        let back = PartitionState::decode(&old, "test").unwrap();
        assert_eq!(back.tables["t"].open, vec![window()]);
        assert_eq!(back.tables["t"].keys.len(), 2);
        // A newer layout is refused with what to do.
        let v9 = zstd::bulk::compress(br#"{"v": 9}"#, 1).unwrap();
        let e = PartitionState::decode(&v9, "p").unwrap_err().to_string();
        assert!(e.contains("newer release"), "{e}");
        // Cut short after the magic.
        let cut = zstd::bulk::compress(b"ST\x02\x10\x00\x00\x00{}", 1).unwrap();
        assert!(PartitionState::decode(&cut, "p").is_err());
        let cut = zstd::bulk::compress(b"ST\x04\x10\x00\x00\x00{}", 1).unwrap();
        assert!(PartitionState::decode(&cut, "p").is_err());
        assert!(
            PartitionState::decode(b"nope", "p")
                .unwrap_err()
                .to_string()
                .contains("p: state")
        );
    }
}
