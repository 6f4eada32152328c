//! The pending record of a group's files: what the conditional checkpoint write stores, spilled
//! to the warehouse when too large for the state item.

use std::collections::HashMap;

use bytes::Bytes;

use super::{Ingestor, Planned};
use crate::checkpoint::{CarriedRows, KeyDeleteFile, PendingBatch, PendingFile};
use crate::error::{Error, Result};
use crate::ledger::Delivery;
use crate::spec::DEAD_LETTER_TABLE;
use crate::table::encode::EncodedFile;

/// Default of [`super::IngestOptions::max_carried_file_bytes`]: a window's partial rows of a
/// batch (tens of rows) are a few KB of Parquet.
pub const MAX_CARRIED_FILE_BYTES: usize = 32 * 1024;

/// Most bytes of files one batch carries in its state file (which cold containers read).
pub const MAX_CARRIED_BATCH_BYTES: usize = crate::process::partition_state::MAX_CARRIED_BYTES;

impl Ingestor {
    /// The files of a batch that may ride in its state file, by position (see
    /// [`CarriedRows`]): derived tables' (never a topic's own table, whose pending files the
    /// interval joins read, nor dead letters) of at most `max_carried_file_bytes`, up to
    /// [`MAX_CARRIED_BATCH_BYTES`] in all — once the commit stage reads carried rows.
    pub(super) async fn carriable(&self, files: &[EncodedFile]) -> Result<Vec<(usize, Bytes)>> {
        let max = self.options.max_carried_file_bytes;
        let small = |f: &EncodedFile| {
            f.bytes.len() <= max
                && f.table != DEAD_LETTER_TABLE
                && self.derived_locations.contains_key(&f.table)
                && !self.topics.values().any(|t| t.spec.name == f.table)
        };
        if max == 0 || !files.iter().any(small) || !self.state.reads_carried_rows().await? {
            return Ok(Vec::new());
        }
        let mut total = 0;
        let mut out = Vec::new();
        for (at, f) in files.iter().enumerate() {
            if small(f) && total + f.bytes.len() <= MAX_CARRIED_BATCH_BYTES {
                total += f.bytes.len();
                out.push((at, f.bytes.clone()));
            }
        }
        Ok(out)
    }

    /// Writes a group's files to the warehouse, concurrently (before their pending record),
    /// but those carried in a state file.
    pub(super) async fn write_files(
        &self,
        files: &[EncodedFile],
        carried: &HashMap<usize, CarriedRows>,
    ) -> Result<()> {
        futures::future::join_all(
            files
                .iter()
                .enumerate()
                .filter(|(at, _)| !carried.contains_key(at))
                .map(|(_, f)| self.warehouse.write(&f.location, f.bytes.clone())),
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
        carried: &HashMap<usize, CarriedRows>,
    ) -> Result<PendingBatch> {
        let mut pending = Vec::with_capacity(files.len());
        for (at, f) in files.iter().enumerate() {
            let layout = if f.table == DEAD_LETTER_TABLE {
                &self.dead_letters
            } else {
                self.layouts
                    .get(&f.table)
                    .ok_or_else(|| Error::Internal(format!("no table {}", f.table)))?
            };
            let carried = carried.get(&at).cloned();
            if f.key_deletes {
                pending.push(PendingFile {
                    table: f.table.clone(),
                    data_file: String::new(),
                    rows: f.data_file.record_count(),
                    bytes: f.bytes.len() as u64,
                    partitioning: None,
                    carried: None,
                    key_deletes: Some(KeyDeleteFile {
                        file: f.location.clone(),
                    }),
                });
                continue;
            }
            pending.push(PendingFile {
                table: f.table.clone(),
                data_file: match carried {
                    Some(_) => String::new(),
                    None => f.data_file_json(layout)?,
                },
                rows: f.data_file.record_count(),
                bytes: f.bytes.len() as u64,
                partitioning: Some(layout.partitioning()),
                carried,
                key_deletes: None,
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
            delivery: Delivery::of(planned.iter().map(|p| {
                // A partition's first batch claims nothing below its first record.
                let from = if p.checkpoint.version == 0 {
                    p.first_offset()
                } else {
                    p.checkpoint.next_offset
                };
                (p.range(), from, p.records.len() as u64)
            })),
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
