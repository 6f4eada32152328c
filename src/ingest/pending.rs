//! The pending record of a group's files: what the conditional checkpoint write stores, spilled
//! to the warehouse when too large for the state item.

use super::encode::EncodedFile;
use super::{Ingestor, Planned};
use crate::checkpoint::{PendingBatch, PendingFile};
use crate::error::{Error, Result};
use crate::spec::DEAD_LETTER_TABLE;

impl Ingestor {
    /// Writes a group's files to the warehouse, concurrently (before their pending record).
    pub(super) async fn write_files(&self, files: &[EncodedFile]) -> Result<()> {
        futures::future::join_all(
            files
                .iter()
                .map(|f| self.warehouse.write(&f.location, f.bytes.clone())),
        )
        .await
        .into_iter()
        .collect()
    }

    /// The pending record of the files, spilled to the warehouse when too large to keep inline.
    pub(super) async fn pending_batch(
        &self,
        planned: &[Planned<'_>],
        files: &[EncodedFile],
    ) -> Result<PendingBatch> {
        let mut pending = Vec::with_capacity(files.len());
        for f in files {
            let layout = if f.table == DEAD_LETTER_TABLE {
                &self.dead_letters
            } else {
                self.layouts
                    .get(&f.table)
                    .ok_or_else(|| Error::Internal(format!("no table {}", f.table)))?
            };
            pending.push(PendingFile {
                table: f.table.clone(),
                data_file: f.data_file_json(layout)?,
                rows: f.data_file.record_count(),
                bytes: f.bytes.len() as u64,
                partitioning: Some(layout.partitioning()),
            });
        }
        let first = &planned[0];
        let (first_offset, last_offset) = (first.first_offset(), first.last_offset());
        let mut batch = PendingBatch {
            source: first.source.clone(),
            first_offset,
            last_offset,
            more: planned[1..].iter().map(Planned::range).collect(),
            created_at_ms: self.clock.now_ms(),
            files: pending,
            files_location: None,
        };
        let json = serde_json::to_vec(&batch.files)
            .map_err(|e| Error::Internal(format!("pending files: {e}")))?;
        if json.len() > self.options.max_inline_files_bytes {
            let hash = xxhash_rust::xxh3::xxh3_64(&json);
            let location = format!(
                "{}/_pending/{}/{}/{first_offset:020}-{last_offset:020}-{hash:016x}.json",
                self.warehouse.root(),
                crate::partition::topic_in_name(&first.source.topic),
                first.source.partition
            );
            self.warehouse.write(&location, json.into()).await?;
            batch.files.clear();
            batch.files_location = Some(location);
        }
        Ok(batch)
    }
}
