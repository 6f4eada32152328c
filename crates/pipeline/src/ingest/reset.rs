//! Moving a partition to a new log: after its topic was deleted and created again (ingest then
//! refuses the partition, [`crate::error::Error::Recreated`]), the pipeline's checkpoint still
//! counts the old log's offsets. `streamtable reset-partition` moves the checkpoint (and the
//! partition's window and dedup state with it) to where the new log starts, in one conditional
//! write, as a batch of no records; the topic's table keeps the old log's rows, and its ledger
//! of delivered offsets for the partition is set aside under a name of its own (the audit then
//! starts the partition's ledger again with the new log).

use std::collections::HashMap;

use crate::checkpoint::{Advance, PendingBatch, SourceAdvance, SourcePartition};
use crate::error::{Error, Result};

use super::Ingestor;

/// What a reset did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionReset {
    /// The checkpoint before.
    pub from: i64,
    /// The checkpoint after.
    pub to: i64,
    /// The latest Kafka timestamp the old log's records had (ms, -1 unknown): the new log's
    /// records below `from` are stamped after it.
    pub old_newest_ms: i64,
    /// Whether the partition's window and dedup state moved with it.
    pub state_moved: bool,
}

impl Ingestor {
    /// Moves `source`'s checkpoint from `from` (where it must be: what the refusal of the
    /// new log named) to `to` (the new log's first offset), with its partition state, in one
    /// conditional write. Refused when the checkpoint is elsewhere (already reset, or moved
    /// since: running it again changes nothing), while a batch of the partition is pending
    /// (its pending key would be the new log's), or when the checkpoint moves meanwhile.
    pub async fn reset_partition(
        &self,
        source: &SourcePartition,
        from: i64,
        to: i64,
    ) -> Result<PartitionReset> {
        if to < 0 {
            return Err(Error::Config(format!(
                "reset of {source}: offset {to} is not a Kafka offset"
            )));
        }
        let checkpoint = self.state.checkpoint(source).await?;
        if checkpoint.next_offset != from {
            return Err(Error::Config(format!(
                "reset of {source}: its checkpoint is at {}, not {from}: it was reset already, or has moved since; nothing changed",
                checkpoint.next_offset
            )));
        }
        let pending = self
            .state
            .pending()
            .await?
            .into_iter()
            .filter(|b| b.ranges().any(|r| r.source == *source))
            .count();
        if pending > 0 {
            return Err(Error::Config(format!(
                "reset of {source}: {pending} batch(es) of the partition are not committed yet; run the scheduled stage (`streamtable scheduled`) first, then the reset"
            )));
        }
        let stored = self
            .state
            .partition_states(std::slice::from_ref(source))
            .await?
            .pop()
            .flatten();
        let now = self.clock.now_ms();
        let (state, seq) = match &stored {
            Some(stored) => {
                let state =
                    super::state_files::read_stored_state(&self.warehouse, source, stored).await?;
                let seq = stored.seq + 1;
                let mut one = HashMap::from([(source.clone(), state)]);
                let mut new = self
                    .write_states(&[(source.clone(), to, seq)], &mut one, Vec::new())
                    .await?
                    .0
                    .pop()
                    .ok_or_else(|| Error::Internal(format!("no state written for {source}")))?;
                new.updated_at_ms = now;
                (Some(new), seq)
            }
            None => (None, checkpoint.version + 1),
        };
        // A batch of no records under a key no delivery has (negative, like an idle flush's).
        let key = -(1i64 << 40).saturating_add(i64::try_from(seq).unwrap_or(0));
        let batch = PendingBatch {
            source: source.clone(),
            first_offset: key,
            last_offset: key,
            more: Vec::new(),
            created_at_ms: now,
            files: Vec::new(),
            files_location: None,
            delivery: Default::default(),
        };
        let advance = SourceAdvance {
            source: source.clone(),
            from: checkpoint,
            to_next_offset: to,
            newest_ms: -1,
            first_offset: -1,
            state,
        };
        match self.state.advance(&[advance], &batch).await? {
            Advance::Advanced => {
                tracing::warn!(partition = %source, from = checkpoint.next_offset, to,
                    "partition moved to a new log");
                Ok(PartitionReset {
                    from: checkpoint.next_offset,
                    to,
                    old_newest_ms: checkpoint.newest_ms,
                    state_moved: stored.is_some(),
                })
            }
            Advance::Conflict => Err(Error::State {
                op: "reset partition",
                message: format!(
                    "the checkpoint of {source} moved while it was being reset (is ingest still taking the partition?); stop the event source mapping for the topic and run the reset again"
                ),
                retryable: true,
            }),
        }
    }
}
