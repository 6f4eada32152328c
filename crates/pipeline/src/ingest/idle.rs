//! Idle partitions: a Kafka partition that receives nothing keeps its watermark, so its share of
//! every window stays open and the windows' totals stay incomplete. After the table's
//! `idle_timeout` without a landed batch, the scheduled stage moves such a partition's watermark
//! up to the lowest watermark among the topic's partitions that still receive (the highest when
//! every partition is idle) and closes the windows it passes — Flink's source idleness, where
//! idle inputs leave the minimum, partition by partition.
//!
//! The flush is an advance like ingest's: the partial rows are written as files, and the
//! pending batch and the new state are recorded in one conditional write that keeps the
//! checkpoint where it is and is fenced by the state's `seq` (and the checkpoint's version): if
//! the partition received a batch in between, the flush changes nothing. Its pending batch is
//! keyed by the negated `seq` in place of an offset (`first_offset = last_offset = -seq`), so it
//! never meets a real batch's key. A record that arrives later in the partition is judged
//! against the moved watermark: a correction within the allowed lateness, else `late`.

use serde::Serialize;

use super::Ingestor;
use crate::checkpoint::{Advance, PendingBatch, PendingFile, SourceAdvance, SourcePartition};
use crate::error::{Error, Result};

/// What [`Ingestor::flush_idle`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IdleFlush {
    /// Idle partitions whose windows were closed.
    pub partitions: u64,
    /// Partial rows they wrote.
    pub rows: u64,
    /// Idle partitions that received a batch while being flushed (left as they are).
    pub raced: u64,
}

impl Ingestor {
    /// Closes, in every stateful partition idle for its table's `idle_timeout`, the windows
    /// the topic's most advanced partition has closed.
    pub async fn flush_idle(&self) -> Result<IdleFlush> {
        let now = self.clock.now_ms();
        let mut report = IdleFlush::default();
        let mut topics: Vec<&String> = self.topics.keys().collect();
        topics.sort();
        for topic in topics {
            let t = &self.topics[topic];
            let Some(et) = &t.spec.event_time else {
                continue;
            };
            if !self.processor.is_stateful(&t.spec.name) {
                continue;
            }
            // A refused table gets no files (they would carry ids the table may not have).
            if let Err(e) = self.check_refused_topic(topic) {
                tracing::warn!(topic = %topic, error = %e, "idle windows not closed: a table of the topic is refused");
                continue;
            }
            let sources: Vec<SourcePartition> = self
                .state
                .partitions(topic)
                .await?
                .into_iter()
                .map(|p| SourcePartition::new(topic, p))
                .collect();
            if sources.len() < 2 {
                continue;
            }
            let stored = self.state.partition_states(&sources).await?;
            let checkpoints = self.state.checkpoints(&sources).await?;
            let mut states = Vec::new();
            let mut files = super::state_files::Files::default();
            for (source, stored) in sources.iter().zip(stored) {
                let Some(stored) = stored else { continue };
                let state =
                    super::state_files::read_header(&self.warehouse, &mut files, source, &stored)
                        .await?;
                states.push((source.clone(), stored, state));
            }
            let ooo = et.out_of_orderness_ms.saturating_mul(1000);
            // Where idle partitions move to: the lowest watermark among the partitions still
            // receiving (Flink: idle inputs leave the minimum), so that a partition far ahead
            // cannot drag the others past what the rest of the topic has seen; when every
            // partition is idle (the stream paused), the highest, so the topic's windows close.
            let is_idle = |s: &crate::checkpoint::StoredState| {
                s.updated_at_ms.saturating_add(et.idle_timeout_ms) <= now
            };
            let active = states
                .iter()
                .filter(|(_, stored, _)| !is_idle(stored))
                .filter_map(|(_, _, s)| s.max_event_time)
                .min();
            let target =
                active.or_else(|| states.iter().filter_map(|(_, _, s)| s.max_event_time).max());
            let Some(topic_watermark) = target.map(|m| m.saturating_sub(ooo)) else {
                continue;
            };
            for (source, stored, mut state) in states {
                let Some(checkpoint) = sources
                    .iter()
                    .position(|s| *s == source)
                    .map(|i| checkpoints[i])
                else {
                    continue;
                };
                let idle = is_idle(&stored);
                if !idle || stored.next_offset != checkpoint.next_offset {
                    continue;
                }
                let seq = stored.seq + 1;
                let derived = self.processor.advance_watermark(
                    &t.spec.name,
                    source.partition,
                    checkpoint.next_offset - 1,
                    &mut state,
                    topic_watermark,
                )?;
                let stem = format!(
                    "{}-{}-idle-{seq:010}",
                    crate::partition::topic_in_name(&source.topic),
                    source.partition
                );
                let mut files = Vec::new();
                for d in &derived {
                    let (Some(rows), Some(location)) =
                        (&d.rows, self.derived_locations.get(&d.table))
                    else {
                        continue;
                    };
                    files.extend(
                        crate::table::encode::encode(&d.layout, rows, location, &stem, &self.props)
                            .await?,
                    );
                }
                if files.is_empty() {
                    continue; // no window to close yet
                }
                let rows: u64 = files.iter().map(|f| f.data_file.record_count()).sum();
                self.write_files(&files, &Default::default()).await?;
                let mut pending = Vec::with_capacity(files.len());
                for f in &files {
                    let layout = self
                        .layouts
                        .get(&f.table)
                        .ok_or_else(|| Error::Internal(format!("no table {}", f.table)))?;
                    pending.push(PendingFile {
                        table: f.table.clone(),
                        data_file: f.data_file_json(layout)?,
                        rows: f.data_file.record_count(),
                        bytes: f.bytes.len() as u64,
                        partitioning: Some(layout.partitioning()),
                        carried: None,
                        key_deletes: None,
                    });
                }
                let key = -(seq as i64);
                let batch = PendingBatch {
                    source: source.clone(),
                    first_offset: key,
                    last_offset: key,
                    more: Vec::new(),
                    created_at_ms: now,
                    files: pending,
                    files_location: None,
                    delivery: Default::default(),
                };
                let mut one = std::collections::HashMap::from([(source.clone(), state)]);
                let mut new = self
                    .write_states(
                        &[(source.clone(), checkpoint.next_offset, seq)],
                        &mut one,
                        Vec::new(),
                    )
                    .await?
                    .0
                    .pop()
                    .ok_or_else(|| Error::Internal(format!("no state written for {source}")))?;
                // Still idle: the flush is not a landing.
                new.updated_at_ms = stored.updated_at_ms;
                let advance = SourceAdvance {
                    source: source.clone(),
                    from: checkpoint,
                    to_next_offset: checkpoint.next_offset,
                    newest_ms: -1,
                    first_offset: -1,
                    state: Some(new.clone()),
                };
                match self.state.advance(&[advance], &batch).await? {
                    Advance::Advanced => {
                        report.partitions += 1;
                        report.rows += rows;
                        tracing::info!(partition = %source, rows, watermark = %crate::clock::rfc3339_ms(topic_watermark / 1000),
                            "idle partition: windows closed at the topic's watermark");
                        if let Some(old) = &stored.location
                            && !old.ends_with(".run")
                            && new.location.as_ref() != Some(old)
                            && let Err(e) = self.warehouse.delete(old).await
                        {
                            tracing::warn!(location = %old, error = %e, "replaced partition state not deleted");
                        }
                    }
                    Advance::Conflict => report.raced += 1,
                }
            }
        }
        Ok(report)
    }
}
