//! Records below a partition's checkpoint that never landed (a batch the event source mapping
//! gave up on), landed by `streamtable replay` without moving the checkpoint.

use std::collections::HashMap;

use super::{IngestSummary, Ingestor, Planned};
use crate::checkpoint::{Checkpoint, SourcePartition};
use crate::error::Result;
use crate::esm::EsmRecord;
use crate::process::partition_state::PartitionState;

impl Ingestor {
    /// Lands records of `source` that lie below its checkpoint but never landed (a batch the
    /// event source mapping gave up on), without moving the checkpoint, while `holder` holds
    /// lock `lock` (see [`crate::replay`]). `Ok(None)` when the lock was lost meanwhile.
    pub async fn land_replayed(
        &self,
        source: &SourcePartition,
        records: &[&EsmRecord],
        lock: &str,
        holder: &str,
    ) -> Result<Option<IngestSummary>> {
        let Some(planned) = Planned::new(source, Checkpoint::INITIAL, records) else {
            return Ok(Some(IngestSummary::default()));
        };
        self.processor.refresh(self.clock.now_ms()).await?;
        let planned = [planned];
        // Replayed records are below the checkpoint, behind the partition's state: stateful
        // tables count them on a state of their own, every window closed at the end (as
        // corrections), so that none is lost.
        let mut states: HashMap<SourcePartition, PartitionState> = HashMap::new();
        if self.is_stateful_topic(&source.topic) {
            states.insert(source.clone(), PartitionState::default());
        }
        let (mut files, counts) = self.encode_group(&planned, &mut states).await?;
        files.extend(self.close_all(&planned, &mut states).await?);
        self.write_files(&files, &Default::default()).await?;
        let mut batch = self
            .pending_batch(&planned, &files, &Default::default())
            .await?;
        // Not a delivery of the event source: no entry of the ledger.
        batch.delivery.replayed = true;
        if !self.state.add_pending(&batch, lock, holder).await? {
            return Ok(None);
        }
        Ok(Some(IngestSummary {
            records: planned[0].records.len() as u64,
            accepted: counts.accepted,
            dead_lettered: counts.rejected,
            key_deletes: counts.key_deletes,
            files_written: files.len() as u64,
            bytes_written: files.iter().map(|f| f.bytes.len() as u64).sum(),
            partitions: 1,
            ..Default::default()
        }))
    }
}
