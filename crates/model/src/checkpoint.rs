//! Checkpoints: the exactly-once state machine of ingest, and the pending batches it records.
//!
//! Per topic-partition the state store holds a [`Checkpoint`]: the next offset to accept and a
//! version. Ingest reads it, drops every record below it ([`plan`]), writes the rest as files,
//! then makes ONE conditional update (the state store's `advance`) that moves the checkpoint forward
//! and records the new files as a [`PendingBatch`], on the condition that the version is still
//! the one it read. A duplicate or zombie invocation loses that race and writes nothing; a
//! checkpoint never moves backwards; a file is recorded at most once.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A Kafka topic-partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourcePartition {
    /// The Kafka topic.
    pub topic: String,
    /// The partition number.
    pub partition: i32,
}

impl SourcePartition {
    /// The topic-partition `topic`-`partition`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        SourcePartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for SourcePartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Progress of one topic-partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Every offset below this was accepted or dead-lettered already.
    pub next_offset: i64,
    /// Incremented by every advance; 0 means no checkpoint yet.
    pub version: u64,
    /// The latest Kafka timestamp (ms) of a record the partition took, -1 when not known (no
    /// record with one yet, or a checkpoint an earlier release wrote): a record below the
    /// checkpoint stamped later was never taken, so its log is not the one the checkpoint
    /// counts ([`recreated`]).
    #[serde(default = "unknown")]
    pub newest_ms: i64,
    /// The first offset the partition took (-1 when not known: a checkpoint an earlier
    /// release created): below it the pipeline never read the log (it started after it), above
    /// it every offset is accounted for — a batch lost before its commit included.
    #[serde(default = "unknown")]
    pub first_offset: i64,
}

/// A timestamp or offset not known: -1.
fn unknown() -> i64 {
    -1
}

impl Checkpoint {
    /// The state of a partition never seen before.
    pub const INITIAL: Checkpoint = Checkpoint {
        next_offset: 0,
        version: 0,
        newest_ms: -1,
        first_offset: -1,
    };

    /// A checkpoint at `next_offset`, `version`, with no timestamp or first offset known.
    pub const fn at(next_offset: i64, version: u64) -> Checkpoint {
        Checkpoint {
            next_offset,
            version,
            newest_ms: -1,
            first_offset: -1,
        }
    }
}

/// Records of a delivery below the checkpoint that the partition never took: stamped after the
/// latest record it did take. A re-delivery only repeats records taken (each stamped at or
/// before that one), so these come from another log under the same topic and partition — a
/// topic deleted and created again, its offsets restarting — and taking them as already seen
/// would lose them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recreated {
    /// The lowest and highest such offset.
    pub offsets: [i64; 2],
    /// How many such records.
    pub records: u64,
    /// The latest timestamp among them (ms).
    pub stamped_ms: i64,
}

/// The records of `records` (offset, Kafka timestamp in ms; -1 none) below `checkpoint` that
/// it never took ([`Recreated`]), if any. Records below the first offset the partition took
/// say nothing (the pipeline started after them: a LATEST start, a log read from later on).
pub fn recreated(
    checkpoint: &Checkpoint,
    records: impl IntoIterator<Item = (i64, i64)>,
) -> Option<Recreated> {
    if checkpoint.newest_ms < 0 {
        return None;
    }
    let mut out: Option<Recreated> = None;
    for (offset, ts) in records {
        if offset >= checkpoint.next_offset
            || offset < checkpoint.first_offset
            || ts <= checkpoint.newest_ms
        {
            continue;
        }
        let r = out.get_or_insert(Recreated {
            offsets: [offset, offset],
            records: 0,
            stamped_ms: ts,
        });
        r.offsets = [r.offsets[0].min(offset), r.offsets[1].max(offset)];
        r.records += 1;
        r.stamped_ms = r.stamped_ms.max(ts);
    }
    out
}

/// One data file awaiting commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingFile {
    /// Table the file belongs to.
    pub table: String,
    /// The Iceberg `DataFile`, serialized (`serialize_data_file_to_json`, format v2).
    pub data_file: String,
    /// Rows in the file.
    pub rows: u64,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// The partitioning the file was written for ([`crate::schema::TableLayout::partitioning`]);
    /// absent in files recorded before 0.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<Vec<String>>,
    /// Rows carried in one of the batch's state files instead of a file of their own; the
    /// commit stage writes them into the table. Then `data_file` is empty, so that a release
    /// that does not know carried rows refuses the batch (keeps it pending) instead of
    /// registering a file that does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried: Option<CarriedRows>,
    /// A file of keys to delete from an upsert table (its topic's tombstones), not a file of
    /// the table: the commit stage deletes the keys' live rows. Then `data_file` is empty, so
    /// that a release that does not know key deletes refuses the batch (keeps it pending)
    /// instead of registering the file as table data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_deletes: Option<KeyDeleteFile>,
}

/// Where a pending batch's tombstones of an upsert table are: a Parquet file of the key columns
/// and the Kafka columns (`kafka_partition`, `kafka_offset`, `kafka_timestamp`, …) with the
/// table's field ids, one row per tombstone, under the table's `data/` directory. Orphan
/// clean-up removes it once the batch is committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDeleteFile {
    /// Its location.
    pub file: String,
}

/// Where a pending file's rows are carried: a state file and the part of its rows
/// (the processing crate's `partition_state::decode_rows`), a Parquet file of the table's rows as ingest
/// encoded them. Small derived-table files (a window's partial rows: tens of rows a batch) ride
/// in the state file the batch writes anyway, which saves a PUT per batch; the commit stage
/// puts the round's into one file per partition value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedRows {
    /// The state file (`{warehouse}/_state/partitions/{topic}/runs/{hash}.run`).
    pub file: String,
    /// The part of its rows.
    pub part: u32,
}

/// The offsets one batch took from one topic-partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourceRange {
    /// The topic-partition.
    pub source: SourcePartition,
    /// Its lowest offset in the batch (accepted or rejected).
    pub first_offset: i64,
    /// Its highest offset in the batch.
    pub last_offset: i64,
}

/// The files of one ingested batch, awaiting commit. A batch covers the new records of every
/// topic-partition of one invocation (up to the pipeline's `ingest::MAX_PARTITIONS_PER_BATCH`): one
/// file per table and partition value, whatever the number of Kafka partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingBatch {
    /// The first topic-partition of the batch (in order), which names it.
    pub source: SourcePartition,
    /// Lowest offset of the first topic-partition's records (accepted or rejected).
    pub first_offset: i64,
    /// Highest offset of the first topic-partition's records.
    pub last_offset: i64,
    /// The batch's other topic-partitions, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more: Vec<SourceRange>,
    /// When the batch was ingested, epoch milliseconds.
    pub created_at_ms: i64,
    /// The files, inline. Empty when they were spilled to `files_location`.
    pub files: Vec<PendingFile>,
    /// Where the file list was written instead, when it was too large to keep inline
    /// (a DynamoDB item holds at most 400 KB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_location: Option<String>,
    /// How many records each range took, where fewer than its offsets (the ledger's input,
    /// see [`crate::ledger`]).
    #[serde(default, skip_serializing_if = "crate::ledger::Delivery::is_whole")]
    pub delivery: crate::ledger::Delivery,
}

impl PendingBatch {
    /// Every topic-partition of the batch with its offsets, the first one first.
    pub fn ranges(&self) -> impl Iterator<Item = SourceRange> + '_ {
        std::iter::once(SourceRange {
            source: self.source.clone(),
            first_offset: self.first_offset,
            last_offset: self.last_offset,
        })
        .chain(self.more.iter().cloned())
    }

    /// The batch's identity in the state store.
    pub fn key(&self) -> BatchKey {
        BatchKey {
            source: self.source.clone(),
            first_offset: self.first_offset,
            created_at_ms: self.created_at_ms,
        }
    }
}

/// Identifies a pending batch: its partition and first offset (unique), and when it was
/// recorded (the commit stage takes batches oldest first).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BatchKey {
    /// The topic-partition.
    pub source: SourcePartition,
    /// The batch's lowest offset.
    pub first_offset: i64,
    /// Absent in intents written by releases before 0.2 (then 0).
    #[serde(default)]
    pub created_at_ms: i64,
}

impl BatchKey {
    /// The key batches are ordered by: age first, then partition and offset. Also the sort key
    /// of the batch's DynamoDB item.
    pub fn sort_key(&self) -> String {
        format!(
            "{:015}#{}#{:010}#{:020}",
            self.created_at_ms.max(0),
            self.source.topic,
            self.source.partition,
            self.first_offset
        )
    }
}

/// One page of pending batches, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingPage {
    /// The batches that could be read.
    pub batches: Vec<PendingBatch>,
    /// Batches whose stored item cannot be read (corrupt, or written by a newer release), with
    /// the reason: reported, never committed, never deleted.
    pub unreadable: Vec<(BatchKey, String)>,
    /// The sort key to continue after, when more batches may follow.
    pub next: Option<String>,
}

/// One topic-partition's part in a conditional advance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceAdvance {
    /// The topic-partition.
    pub source: SourcePartition,
    /// The checkpoint it must still be at.
    pub from: Checkpoint,
    /// Its next offset afterwards.
    pub to_next_offset: i64,
    /// The latest Kafka timestamp (ms) of the records it takes (-1: none has one).
    pub newest_ms: i64,
    /// The first offset it takes (-1: none); kept as the checkpoint's first when the
    /// partition had no checkpoint yet.
    pub first_offset: i64,
    /// The state of its stateful derived tables afterwards (written in the same conditional
    /// write, on the condition that the stored state is still at `seq - 1`), if it has any.
    pub state: Option<StoredState>,
}

/// The state of a partition's stateful derived tables as the state store keeps it, beside the
/// checkpoint (the processing crate's `PartitionState`, encoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredState {
    /// The checkpoint's next offset this state goes with.
    pub next_offset: i64,
    /// Incremented by every write; the write is conditioned on the previous value.
    pub seq: u64,
    /// The encoded state, when kept inline.
    pub body: Option<Vec<u8>>,
    /// Where the encoded state was written instead, when it was too large for the item.
    pub location: Option<String>,
    /// Size of the encoded state, bytes.
    pub bytes: u64,
    /// When it was written, epoch ms.
    pub updated_at_ms: i64,
}

impl SourceAdvance {
    /// The checkpoint after the advance.
    pub fn to(&self) -> Checkpoint {
        Checkpoint {
            next_offset: self.to_next_offset,
            version: self.from.version + 1,
            newest_ms: self.newest_ms.max(self.from.newest_ms),
            first_offset: if self.from.version == 0 {
                self.first_offset
            } else {
                self.from.first_offset
            },
        }
    }
}

/// What a conditional advance did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advance {
    /// Every checkpoint moved and the batch was recorded.
    Advanced,
    /// Some checkpoint was no longer at the expected version: another invocation advanced it.
    /// Nothing was changed.
    Conflict,
}

/// Which of a partition's records to process, given its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Indexes (into the offered records) of records to process, in offset order, each offset once.
    pub accept: Vec<usize>,
    /// Records dropped because their offset is below the checkpoint (or repeated in the batch).
    pub already_seen: usize,
    /// The checkpoint's next offset after processing `accept`.
    pub next_offset: i64,
}

/// Decides which records of a batch are new. Offsets may have gaps and arrive in any order.
pub fn plan(checkpoint: Checkpoint, offsets: &[i64]) -> Plan {
    let mut order: Vec<usize> = (0..offsets.len()).collect();
    order.sort_by_key(|&i| (offsets[i], i));
    let mut accept = Vec::with_capacity(order.len());
    let mut already_seen = 0;
    let mut next_offset = checkpoint.next_offset;
    for i in order {
        if offsets[i] < next_offset {
            already_seen += 1;
        } else {
            accept.push(i);
            next_offset = offsets[i].saturating_add(1);
        }
    }
    Plan {
        accept,
        already_seen,
        next_offset,
    }
}

/// The most offset ranges a stored batch names (far more than the partitions one batch can
/// take): a stored list longer than this is damage, refused before it is expanded.
pub const MAX_RANGES: usize = 65_536;

/// The most bytes a stored batch's ranges take once expanded (each range holds its topic's
/// name): 4,096 partitions of a 249-byte topic take 1.2 MB; a stored list that names a
/// megabyte-long topic for every range is damage, refused before it is expanded.
pub const MAX_RANGE_BYTES: usize = 16 << 20;

/// Why ranges of these (topic name length, count) cannot be stored or read back, if so.
pub fn ranges_beyond_limits(topics: impl IntoIterator<Item = (usize, usize)>) -> Option<String> {
    let (mut count, mut bytes) = (0usize, 0usize);
    for (topic_len, n) in topics {
        count = count.saturating_add(n);
        bytes = bytes.saturating_add(n.saturating_mul(topic_len.saturating_add(48)));
    }
    if count > MAX_RANGES {
        Some(format!(
            "{count} ranges, more than a batch has ({MAX_RANGES})"
        ))
    } else if bytes > MAX_RANGE_BYTES {
        Some(format!(
            "ranges of {bytes} bytes with their topic names, more than {MAX_RANGE_BYTES}"
        ))
    } else {
        None
    }
}

/// The compact form of a batch's other ranges kept in a state item: `{"topic":[[partition,
/// first, last], …]}` (about 15 bytes a partition).
pub fn encode_ranges(ranges: &[SourceRange]) -> String {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<[i64; 3]>> = Default::default();
    for r in ranges {
        by_topic.entry(&r.source.topic).or_default().push([
            i64::from(r.source.partition),
            r.first_offset,
            r.last_offset,
        ]);
    }
    serde_json::to_string(&by_topic).unwrap_or_default()
}

/// Reads [`encode_ranges`]' form back.
pub fn decode_ranges(text: &str) -> Result<Vec<SourceRange>, String> {
    let by_topic: std::collections::BTreeMap<String, Vec<[i64; 3]>> =
        serde_json::from_str(text).map_err(|e| format!("ranges: {e}"))?;
    if let Some(why) = ranges_beyond_limits(by_topic.iter().map(|(t, rs)| (t.len(), rs.len()))) {
        return Err(format!("ranges: {why}"));
    }
    let mut out = Vec::new();
    for (topic, rs) in by_topic {
        for [p, first, last] in rs {
            let partition = i32::try_from(p).map_err(|_| format!("ranges: partition {p}"))?;
            out.push(SourceRange {
                source: SourcePartition::new(topic.clone(), partition),
                first_offset: first,
                last_offset: last,
            });
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ranges_round_trip_in_their_compact_form() {
        let rs = vec![
            SourceRange {
                source: SourcePartition::new("orders", 1),
                first_offset: 10,
                last_offset: 19,
            },
            SourceRange {
                source: SourcePartition::new("orders", 2),
                first_offset: 0,
                last_offset: 5,
            },
            SourceRange {
                source: SourcePartition::new("payments", 0),
                first_offset: 7,
                last_offset: 7,
            },
        ];
        let text = encode_ranges(&rs);
        assert_eq!(
            text,
            r#"{"orders":[[1,10,19],[2,0,5]],"payments":[[0,7,7]]}"#
        );
        assert_eq!(decode_ranges(&text), Ok(rs));
        assert!(decode_ranges("{").is_err());
    }

    #[test]
    fn a_new_partition_accepts_everything() {
        let p = plan(Checkpoint::INITIAL, &[0, 1, 2]);
        assert_eq!(p.accept, vec![0, 1, 2]);
        assert_eq!(p.already_seen, 0);
        assert_eq!(p.next_offset, 3);
    }

    #[test]
    fn a_redelivery_overlapping_the_checkpoint_keeps_only_new_offsets() {
        let cp = Checkpoint::at(12, 3);
        let p = plan(cp, &[10, 11, 12, 13]);
        assert_eq!(p.accept, vec![2, 3]);
        assert_eq!(p.already_seen, 2);
        assert_eq!(p.next_offset, 14);
    }

    #[test]
    fn a_fully_seen_batch_leaves_the_checkpoint_alone() {
        let cp = Checkpoint::at(100, 9);
        let p = plan(cp, &[50, 99]);
        assert!(p.accept.is_empty());
        assert_eq!(p.next_offset, 100);
    }

    #[test]
    fn records_below_the_checkpoint_stamped_after_the_latest_taken_are_another_log() {
        let cp = Checkpoint {
            newest_ms: 5_000,
            ..Checkpoint::at(3_000, 7)
        };
        // A re-delivery: records taken, stamped at or before the latest one.
        assert_eq!(
            recreated(&cp, [(0, 1_000), (2_999, 5_000), (3_000, 9_000)]),
            None
        );
        // Offsets restarting under later stamps: a new log.
        assert_eq!(
            recreated(&cp, [(0, 6_000), (1, 6_001), (2, -1), (3_000, 7_000)]),
            Some(Recreated {
                offsets: [0, 1],
                records: 2,
                stamped_ms: 6_001
            })
        );
        // Below the first offset the partition took (it started after them): no evidence.
        let started_late = Checkpoint {
            first_offset: 5,
            ..cp
        };
        assert_eq!(recreated(&started_late, [(0, 6_000), (4, 6_001)]), None);
        assert!(recreated(&started_late, [(5, 6_000)]).is_some());
        // Nothing known of the stamps (an earlier release's checkpoint): no evidence.
        assert_eq!(recreated(&Checkpoint::at(3_000, 7), [(0, 6_000)]), None);
        // The advance keeps the latest stamp.
        let a = SourceAdvance {
            source: SourcePartition::new("t", 0),
            from: cp,
            to_next_offset: 3_001,
            newest_ms: 4_000,
            first_offset: 3_000,
            state: None,
        };
        assert_eq!(a.to().newest_ms, 5_000);
        // The first offset is the first advance's, kept by the later ones.
        assert_eq!(
            a.to().first_offset,
            -1,
            "an existing checkpoint's is not known"
        );
        let first = SourceAdvance {
            from: Checkpoint::INITIAL,
            ..a.clone()
        };
        assert_eq!(first.to().first_offset, 3_000);
    }

    #[test]
    fn gaps_are_normal_and_duplicates_within_a_batch_count_once() {
        let p = plan(Checkpoint::INITIAL, &[7, 3, 3, 20]);
        assert_eq!(p.accept, vec![1, 0, 3]);
        assert_eq!(p.already_seen, 1);
        assert_eq!(p.next_offset, 21);
    }

    proptest! {
        #[test]
        fn plan_never_moves_backwards_and_accepts_each_new_offset_once(
            next in 0i64..50, offsets in proptest::collection::vec(0i64..100, 0..40)
        ) {
            let cp = Checkpoint::at(next, 1);
            let p = plan(cp, &offsets);
            prop_assert!(p.next_offset >= next);
            let accepted: Vec<i64> = p.accept.iter().map(|&i| offsets[i]).collect();
            let mut expected: Vec<i64> = offsets.iter().copied().filter(|&o| o >= next).collect();
            expected.sort();
            expected.dedup();
            prop_assert_eq!(&accepted, &expected);
            prop_assert_eq!(p.already_seen + accepted.len(), offsets.len());
            if let Some(last) = accepted.last() {
                prop_assert_eq!(p.next_offset, last + 1);
            }
        }
    }
}
