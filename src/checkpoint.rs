//! Checkpoints: the exactly-once state machine of ingest, and the pending batches it records.
//!
//! Per topic-partition the state store holds a [`Checkpoint`]: the next offset to accept and a
//! version. Ingest reads it, drops every record below it ([`plan`]), writes the rest as files,
//! then makes ONE conditional update ([`CheckpointStore::advance`]) that moves the checkpoint forward
//! and records the new files as a [`PendingBatch`], on the condition that the version is still
//! the one it read. A duplicate or zombie invocation loses that race and writes nothing; a
//! checkpoint never moves backwards; a file is recorded at most once.

use std::fmt;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::state::CheckpointStore;

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
}

impl Checkpoint {
    /// The state of a partition never seen before.
    pub const INITIAL: Checkpoint = Checkpoint {
        next_offset: 0,
        version: 0,
    };
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
}

/// The files of one ingested batch of one topic-partition, awaiting commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingBatch {
    /// The topic-partition the batch came from.
    pub source: SourcePartition,
    /// Lowest offset of the batch's records (accepted or rejected).
    pub first_offset: i64,
    /// Highest offset of the batch's records.
    pub last_offset: i64,
    /// When the batch was ingested, epoch milliseconds.
    pub created_at_ms: i64,
    /// The files, inline. Empty when they were spilled to `files_location`.
    pub files: Vec<PendingFile>,
    /// Where the file list was written instead, when it was too large to keep inline
    /// (a DynamoDB item holds at most 400 KB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_location: Option<String>,
}

impl PendingBatch {
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

/// What a conditional advance did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// The checkpoint moved to this state and the batch was recorded.
    Advanced(Checkpoint),
    /// The checkpoint was no longer at the expected version: someone else advanced it.
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_new_partition_accepts_everything() {
        let p = plan(Checkpoint::INITIAL, &[0, 1, 2]);
        assert_eq!(p.accept, vec![0, 1, 2]);
        assert_eq!(p.already_seen, 0);
        assert_eq!(p.next_offset, 3);
    }

    #[test]
    fn a_redelivery_overlapping_the_checkpoint_keeps_only_new_offsets() {
        let cp = Checkpoint {
            next_offset: 12,
            version: 3,
        };
        let p = plan(cp, &[10, 11, 12, 13]);
        assert_eq!(p.accept, vec![2, 3]);
        assert_eq!(p.already_seen, 2);
        assert_eq!(p.next_offset, 14);
    }

    #[test]
    fn a_fully_seen_batch_leaves_the_checkpoint_alone() {
        let cp = Checkpoint {
            next_offset: 100,
            version: 9,
        };
        let p = plan(cp, &[50, 99]);
        assert!(p.accept.is_empty());
        assert_eq!(p.next_offset, 100);
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
            let cp = Checkpoint { next_offset: next, version: 1 };
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
