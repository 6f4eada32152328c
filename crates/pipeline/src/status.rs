//! What an operator asks when something looks wrong — per topic-partition: where its checkpoint
//! is, when records last landed, what waits to be committed; per table: the last commit and
//! compaction; and what the last scheduled run could not do. Read from the state store and the
//! catalog, the same on the embedded backend and on AWS (`streamtable status`).
//!
//! A pending batch says when it landed until it is committed; then the commit records, per
//! topic-partition, when its newest committed batch landed (the state store's `landed` status,
//! rewritten after each commit round; two committers racing can only make it show an older
//! landing, never lose data).

use std::collections::BTreeMap;

use iceberg::spec::Operation;
use serde::Serialize;

use crate::backend::Backend;
use crate::checkpoint::SourcePartition;
use crate::error::Result;
use crate::scheduled::RunStatus;
use crate::spec::PipelineSpec;
use crate::tables::TableSet;

pub use crate::commit::landings::{LANDED_KEY, LANDED_LIMIT, Landings};

/// One topic-partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionStatus {
    /// The topic.
    pub topic: String,
    /// The Kafka partition.
    pub partition: i32,
    /// Every offset below it landed (or was dead-lettered).
    pub next_offset: i64,
    /// When records of it last landed, epoch ms (unknown for batches committed before
    /// landings were recorded).
    pub last_landed_ms: Option<i64>,
    /// Its batches waiting to be committed.
    pub pending_batches: u64,
    /// When the oldest of them landed, epoch ms.
    pub oldest_pending_ms: Option<i64>,
}

/// One table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableStatus {
    /// The table.
    pub table: String,
    /// Its newest snapshot (commit or compaction), epoch ms; `None`: not created yet.
    pub last_commit_ms: Option<i64>,
    /// Its newest compaction (`replace` snapshot), epoch ms.
    pub last_compaction_ms: Option<i64>,
}

/// Everything `streamtable status` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// When it was read, epoch ms.
    pub now_ms: i64,
    /// Every topic-partition with a checkpoint, by topic and partition.
    pub partitions: Vec<PartitionStatus>,
    /// Every table of the spec.
    pub tables: Vec<TableStatus>,
    /// What the last scheduled run left: failures, blocked batches, backlog.
    pub last_run: Option<RunStatus>,
}

/// Reads the status of `spec`'s pipeline on `backend`.
pub async fn gather(backend: &Backend, spec: &PipelineSpec) -> Result<Status> {
    let landings = Landings::load(backend).await?;
    let pending = backend.state.pending().await?;
    let mut waiting: BTreeMap<(String, i32), (u64, i64, i64)> = BTreeMap::new();
    for b in &pending {
        for r in b.ranges() {
            let e = waiting
                .entry((r.source.topic.clone(), r.source.partition))
                .or_insert((0, i64::MAX, i64::MIN));
            e.0 += 1;
            e.1 = e.1.min(b.created_at_ms);
            e.2 = e.2.max(b.created_at_ms);
        }
    }
    let mut partitions = Vec::new();
    for t in &spec.tables {
        let mut ids = backend.state.partitions(&t.topic).await?;
        ids.sort_unstable();
        let sources: Vec<SourcePartition> = ids
            .iter()
            .map(|p| SourcePartition::new(&t.topic, *p))
            .collect();
        let checkpoints = backend.state.checkpoints(&sources).await?;
        for (s, c) in sources.iter().zip(checkpoints) {
            let w = waiting.get(&(s.topic.clone(), s.partition));
            let committed = landings
                .partitions
                .get(&format!("{}/{}", s.topic, s.partition))
                .map(|l| l.1);
            let last_landed_ms = match (w.map(|w| w.2), committed) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            partitions.push(PartitionStatus {
                topic: s.topic.clone(),
                partition: s.partition,
                next_offset: c.next_offset,
                last_landed_ms,
                pending_batches: w.map_or(0, |w| w.0),
                oldest_pending_ms: w.map(|w| w.1),
            });
        }
    }
    let set = TableSet::new(spec, &backend.namespace)?;
    let mut tables = Vec::new();
    for name in set.tables.keys() {
        let (last_commit_ms, last_compaction_ms) =
            match backend.catalog.load(&set.ident(name)).await? {
                None => (None, None),
                Some((table, _)) => {
                    let m = table.metadata();
                    (
                        m.snapshots().map(|s| s.timestamp_ms()).max(),
                        m.snapshots()
                            .filter(|s| s.summary().operation == Operation::Replace)
                            .map(|s| s.timestamp_ms())
                            .max(),
                    )
                }
            };
        tables.push(TableStatus {
            table: name.clone(),
            last_commit_ms,
            last_compaction_ms,
        });
    }
    Ok(Status {
        now_ms: backend.clock.now_ms(),
        partitions,
        tables,
        last_run: crate::scheduled::last_run(backend).await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{PendingBatch, SourceRange};

    fn batch(
        partition: i32,
        first: i64,
        last: i64,
        at: i64,
        more: Vec<SourceRange>,
    ) -> PendingBatch {
        PendingBatch {
            source: SourcePartition::new("orders", partition),
            first_offset: first,
            last_offset: last,
            more,
            created_at_ms: at,
            files: Vec::new(),
            files_location: None,
            delivery: Default::default(),
        }
    }

    #[test]
    fn landings_keep_each_partitions_newest_batch_and_stay_bounded() {
        let mut l = Landings::default();
        let wide = vec![SourceRange {
            source: SourcePartition::new("orders", 1),
            first_offset: 0,
            last_offset: 9,
        }];
        l.add(&[
            batch(0, 0, 4, 1_000, wide),
            batch(0, 5, 7, 2_000, Vec::new()),
        ]);
        l.add(&[batch(0, 0, 4, 1_000, Vec::new())]); // an older batch committed late
        assert_eq!(l.partitions["orders/0"], (8, 2_000));
        assert_eq!(l.partitions["orders/1"], (10, 1_000));
        let many: Vec<PendingBatch> = (0..LANDED_LIMIT as i32 + 5)
            .map(|p| batch(p, 0, 0, 10_000 + i64::from(p), Vec::new()))
            .collect();
        l.add(&many);
        assert_eq!(l.partitions.len(), LANDED_LIMIT);
        assert!(
            !l.partitions.contains_key("orders/1"),
            "the oldest go first"
        );
    }
}
