//! The state of stateful derived tables in one Kafka partition — the watermark, each windowed
//! table's open windows, each dedup's keys — as it is stored with the partition's checkpoint
//! (see [`crate::state::StoredState`]): zstd-compressed, versioned. Layouts 2 and 3 are a magic
//! (`ST\x02`), the length (u32) of the JSON of everything but the dedup keys (its `v` is the
//! layout), that JSON, then the dedup keys packed (`seen.rs`; layout 3 front-codes them); layout
//! 1 was the whole state as JSON. All three are read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cell::Cell;
use crate::error::{Error, Result};

mod compat;
mod seen;

pub use compat::{Adoption, PlanSig, StateChanges, adopt};

/// The layout version [`PartitionState::encode`] writes (3: layout 2 with front-coded dedup
/// keys; the magic stays, so a release that reads only layout 2 refuses it by this number with
/// what to do).
const VERSION: u32 = 3;

/// What layout 2 starts with (layout 1 is JSON: `{`).
const MAGIC: &[u8; 3] = b"ST\x02";

/// Everything the derived tables of one topic keep about one of its partitions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Layout version.
    #[serde(default)]
    pub v: u32,
    /// The highest event time the partition has carried, µs (the watermark is this minus the
    /// table's out-of-orderness).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_event_time: Option<i64>,
    /// When records last landed in the partition, epoch ms (idle detection).
    #[serde(default)]
    pub updated_at_ms: i64,
    /// Per derived table.
    #[serde(default)]
    pub tables: BTreeMap<String, TableState>,
}

/// One derived table's state in one partition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableState {
    /// What the plan that wrote this state keeps in it (`None`: a release before plans were
    /// recorded), so that a changed SQL is carried over, restarted, or refused — never misread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanSig>,
    /// When a plan that knows this table last wrote its state, epoch ms. A release that does
    /// not know the table (a rolling deploy, an older container) keeps the state as it is.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub written_at_ms: i64,
    /// Open windows, by start and key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open: Vec<OpenWindow>,
    /// Dedup keys still inside their bound, with their first event time (µs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen: Vec<(Vec<Cell>, i64)>,
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
    pub key: Vec<Cell>,
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
    Min(Cell),
    /// `max`: the greatest value so far.
    Max(Cell),
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

/// The JSON part of a stored state: everything but the dedup keys, borrowed.
#[derive(Serialize)]
struct Header<'a> {
    v: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_event_time: Option<i64>,
    updated_at_ms: i64,
    tables: BTreeMap<&'a str, OpenOnly<'a>>,
}

#[derive(Serialize)]
struct OpenOnly<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a PlanSig>,
    #[serde(skip_serializing_if = "is_zero")]
    written_at_ms: i64,
    #[serde(skip_serializing_if = "<[OpenWindow]>::is_empty")]
    open: &'a [OpenWindow],
}

impl PartitionState {
    /// The state as stored (layout 2, zstd-compressed).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let header = Header {
            v: VERSION,
            max_event_time: self.max_event_time,
            updated_at_ms: self.updated_at_ms,
            tables: self
                .tables
                .iter()
                .map(|(name, t)| {
                    (
                        name.as_str(),
                        OpenOnly {
                            plan: t.plan.as_ref(),
                            written_at_ms: t.written_at_ms,
                            open: &t.open,
                        },
                    )
                })
                .collect(),
        };
        let json = serde_json::to_vec(&header)
            .map_err(|e| Error::Internal(format!("serialize partition state: {e}")))?;
        let json_len = u32::try_from(json.len())
            .map_err(|_| Error::Internal("partition state over 4 GB".into()))?;
        let mut raw = Vec::with_capacity(json.len() + 64);
        raw.extend(MAGIC);
        raw.extend(json_len.to_le_bytes());
        raw.extend(json);
        seen::pack(
            self.tables
                .iter()
                .filter(|(_, t)| !t.seen.is_empty())
                .map(|(name, t)| (name.as_str(), t.seen.as_slice())),
            &mut raw,
        )?;
        // One compression context per thread, reused: creating one costs more than compressing
        // a small state.
        thread_local! {
            static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
                const { std::cell::RefCell::new(None) };
        }
        COMPRESSOR.with(|c| {
            let mut c = c.borrow_mut();
            let compressor = match c.as_mut() {
                Some(compressor) => compressor,
                None => c.insert(
                    zstd::bulk::Compressor::new(1)
                        .map_err(|e| Error::Internal(format!("compress partition state: {e}")))?,
                ),
            };
            compressor
                .compress(&raw)
                .map_err(|e| Error::Internal(format!("compress partition state: {e}")))
        })
    }

    /// Reads what [`PartitionState::encode`] wrote (or layout 1); `what` names it in errors.
    pub fn decode(bytes: &[u8], what: &str) -> Result<PartitionState> {
        let raw = zstd::stream::decode_all(bytes)
            .map_err(|e| Error::Internal(format!("{what}: state is not zstd: {e}")))?;
        let (json, packed) = match raw.strip_prefix(MAGIC) {
            Some(rest) => {
                let (len, rest) = rest
                    .split_first_chunk::<4>()
                    .ok_or_else(|| Error::Internal(format!("{what}: state is cut short")))?;
                let len = u32::from_le_bytes(*len) as usize;
                rest.split_at_checked(len)
                    .ok_or_else(|| Error::Internal(format!("{what}: state is cut short")))?
            }
            None => (raw.as_slice(), &[][..]),
        };
        let mut s: PartitionState = serde_json::from_slice(json)
            .map_err(|e| Error::Internal(format!("{what}: state cannot be read: {e}")))?;
        if s.v > VERSION {
            return Err(Error::Internal(format!(
                "{what}: state of layout {} was written by a newer release (this one reads {VERSION}); deploy that release",
                s.v
            )));
        }
        for (name, keys) in seen::unpack(packed, what)? {
            s.tables.entry(name).or_default().seen = keys;
        }
        // Dedup merges a batch's keys with these in one pass, so they must be sorted; layout 1
        // kept them in no particular order.
        for t in s.tables.values_mut() {
            if !t.seen.is_sorted_by(|a, b| a.0 <= b.0) {
                t.seen.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        let mut s = PartitionState {
            max_event_time: Some(1_700_000_000_000_000),
            updated_at_ms: 5,
            ..Default::default()
        };
        s.tables.insert(
            "orders_per_minute".into(),
            TableState {
                plan: None,
                written_at_ms: 0,
                open: vec![OpenWindow {
                    end: None,
                    start: 60_000_000,
                    key: vec![Cell::Str("DE".into())],
                    accs: vec![
                        Acc::Count(3),
                        Acc::SumInt(Some(i128::MAX)),
                        Acc::Avg {
                            sum: f64::NAN.to_bits(),
                            count: 1,
                        },
                        Acc::Distinct(crate::process::sketch::Sketch::of(&[
                            Cell::Str("c-1".into()),
                            Cell::Str("c-2".into()),
                        ])),
                    ],
                }],
                seen: vec![(vec![Cell::Str("o-1".into())], 7)],
            },
        );
        let bytes = s.encode().unwrap();
        let back = PartitionState::decode(&bytes, "test").unwrap();
        assert_eq!(back.tables, s.tables);
        assert_eq!(back.v, VERSION);
        assert_eq!(back.max_event_time, s.max_event_time);
        assert_eq!(back.updated_at_ms, 5);
        // Layout 1 (all JSON), as the previous release wrote it, is still read, its dedup keys
        // (which it kept in no particular order) sorted.
        let mut v1 = s.clone();
        v1.v = 1;
        let unsorted = vec![
            (vec![Cell::Str("o-2".into())], 9),
            (vec![Cell::Str("o-1".into())], 7),
        ];
        if let Some(t) = v1.tables.get_mut("orders_per_minute") {
            t.seen = unsorted.clone();
        }
        let old = zstd::bulk::compress(&serde_json::to_vec(&v1).unwrap(), 1).unwrap();
        let back = PartitionState::decode(&old, "test").unwrap();
        assert_eq!(
            back.tables["orders_per_minute"].open,
            s.tables["orders_per_minute"].open
        );
        assert_eq!(
            back.tables["orders_per_minute"].seen,
            vec![unsorted[1].clone(), unsorted[0].clone()]
        );
        // A state of a newer layout is refused with what to do.
        let mut v9 = s.clone();
        v9.v = 9;
        let newer = zstd::bulk::compress(&serde_json::to_vec(&v9).unwrap(), 1).unwrap();
        let e = PartitionState::decode(&newer, "p").unwrap_err().to_string();
        assert!(e.contains("newer release"), "{e}");
        // Cut short after the magic.
        let cut = zstd::bulk::compress(b"ST\x02\x10\x00\x00\x00{}", 1).unwrap();
        assert!(PartitionState::decode(&cut, "p").is_err());
        assert!(
            PartitionState::decode(b"nope", "p")
                .unwrap_err()
                .to_string()
                .contains("p: state")
        );
    }
}
