//! Ingest: one MSK event-source-mapping batch to Parquet micro-files, exactly once.
//!
//! Per topic-partition of the batch (see [`crate::checkpoint`] for the protocol):
//! 1. read the checkpoint and drop records below it;
//! 2. decode the rest; rejected records become dead letters;
//! 3. encode Parquet files for the table and for `dead_letters`, and upload them;
//! 4. advance the checkpoint and record the files as pending, in one conditional write.
//!
//! If the conditional write loses (a duplicate or zombie invocation got there first), the
//! partition is re-planned from the new checkpoint; usually nothing is left to do. Files written
//! by the loser are never referenced and are removed later by orphan clean-up.

pub mod encode;
mod options;
mod records;
mod summary;

pub use options::IngestOptions;
pub use summary::IngestSummary;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::esm::{EsmEvent, EsmRecord};
use futures::future::join_all;
use parquet::file::properties::WriterProperties;

use crate::checkpoint::{Advance, PendingBatch, PendingFile, SourcePartition, plan};
use crate::clock::Clock;
use crate::config::Backend;
use crate::decode::{DeadLetterBuilder, RecordDecoder};
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::{DEAD_LETTER_TABLE, PipelineSpec, TableSpec};
use crate::state::StateStore;
use crate::storage::Warehouse;
use encode::EncodedFile;

/// Default: how often a partition is re-planned after losing the conditional write.
pub const MAX_ATTEMPTS: u32 = 8;
/// Default: file lists larger than this are written to the warehouse instead of the state item.
pub const MAX_INLINE_FILES_BYTES: usize = 300 * 1024;

/// A table fed by a topic, with what decoding and writing it needs.
pub(crate) struct TopicTable {
    pub spec: TableSpec,
    pub layout: Arc<TableLayout>,
    pub decoder: RecordDecoder,
    pub location: String,
}

/// The ingest handler. Build once per process; [`Ingestor::handle`] once per batch.
pub struct Ingestor {
    topics: HashMap<String, TopicTable>,
    dead_letters: Arc<TableLayout>,
    dead_letter_location: String,
    options: IngestOptions,
    warehouse: Warehouse,
    state: Arc<dyn StateStore>,
    props: WriterProperties,
    clock: Arc<dyn Clock>,
}

impl Ingestor {
    /// An ingestor for `spec` on `backend`.
    pub fn new(spec: &PipelineSpec, backend: &Backend) -> Result<Ingestor> {
        Ok(Self::with_parts(
            spec,
            backend.warehouse.clone(),
            backend.state.clone(),
            &backend.namespace,
        )?
        .with_clock(backend.clock.clone()))
    }

    /// The same ingestor with other options.
    pub fn with_options(mut self, options: IngestOptions) -> Ingestor {
        self.props = encode::micro_file_properties_at(options.zstd_level);
        self.options = options;
        self
    }

    /// The ingestor's options.
    pub fn options(&self) -> &IngestOptions {
        &self.options
    }

    /// The same ingestor on another clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Ingestor {
        self.clock = clock;
        self
    }

    /// An ingestor on explicit parts (tests wrap the state store).
    pub fn with_parts(
        spec: &PipelineSpec,
        warehouse: Warehouse,
        state: Arc<dyn StateStore>,
        namespace: &str,
    ) -> Result<Ingestor> {
        let mut topics = HashMap::new();
        for t in &spec.tables {
            topics.insert(
                t.topic.clone(),
                TopicTable {
                    spec: t.clone(),
                    layout: Arc::new(TableLayout::for_table(t)?),
                    decoder: RecordDecoder::new(t),
                    location: warehouse.table_location(namespace, &t.name),
                },
            );
        }
        Ok(Ingestor {
            topics,
            dead_letters: Arc::new(TableLayout::dead_letters()?),
            dead_letter_location: warehouse.table_location(namespace, DEAD_LETTER_TABLE),
            options: IngestOptions::for_spec(spec),
            warehouse,
            state,
            props: encode::micro_file_properties(),
            clock: crate::clock::system(),
        })
    }

    /// Lands one ESM batch. Returns an error only when some partition could not be landed;
    /// partitions that were landed stay landed, and a retry skips them by their checkpoints.
    pub async fn handle(&self, event: &EsmEvent) -> Result<IngestSummary> {
        let groups = group_by_partition(event)?;
        let results = join_all(
            groups
                .iter()
                .map(|(source, records)| self.ingest_partition(source, records)),
        )
        .await;
        let mut total = IngestSummary::default();
        let mut first_error = None;
        for r in results {
            match r {
                Ok(s) => total.add(&s),
                Err(e) => {
                    tracing::error!(error = %e, retryable = e.is_retryable(), "partition not landed");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// The CPU work of one invocation with no I/O: decodes and encodes every record of the
    /// event as if none had been seen. Returns the records processed and the encoded files.
    pub async fn encode_event(&self, event: &EsmEvent) -> Result<(u64, Vec<EncodedFile>)> {
        let mut files = Vec::new();
        let mut records = 0;
        for (source, group) in group_by_partition(event)? {
            let offsets: Vec<i64> = group.iter().map(|r| r.offset).collect();
            let plan = plan(crate::checkpoint::Checkpoint::INITIAL, &offsets);
            let new: Vec<&EsmRecord> = plan.accept.iter().map(|&i| group[i]).collect();
            if let (Some(first), Some(last)) = (new.first(), new.last()) {
                let (first, last) = (first.offset, last.offset);
                files.extend(self.encode_partition(&source, &new, first, last).await?.0);
                records += new.len() as u64;
            }
        }
        Ok((records, files))
    }

    async fn ingest_partition(
        &self,
        source: &SourcePartition,
        records: &[&EsmRecord],
    ) -> Result<IngestSummary> {
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        let mut summary = IngestSummary {
            records: records.len() as u64,
            partitions: 1,
            newest_timestamp_ms: records.iter().map(|r| r.timestamp).max(),
            ..Default::default()
        };
        for attempt in 0..self.options.max_attempts {
            if attempt > 0 {
                // Two invocations that collided must not collide again in lockstep.
                tokio::time::sleep(backoff(attempt)).await;
            }
            let checkpoint = self.state.checkpoint(source).await?;
            let plan = plan(checkpoint, &offsets);
            summary.already_seen = plan.already_seen as u64;
            if plan.accept.is_empty() {
                return Ok(summary);
            }
            let new: Vec<&EsmRecord> = plan.accept.iter().map(|&i| records[i]).collect();
            let (first, last) = (new[0].offset, new[new.len() - 1].offset);
            let (files, decoded) = self.encode_partition(source, &new, first, last).await?;
            join_all(
                files
                    .iter()
                    .map(|f| self.warehouse.write(&f.location, f.bytes.clone())),
            )
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
            let batch = self.pending_batch(source, first, last, &files).await?;
            match self
                .state
                .advance(source, checkpoint, plan.next_offset, &batch)
                .await?
            {
                Advance::Advanced(cp) => {
                    summary.accepted = decoded.accepted;
                    summary.dead_lettered = decoded.rejected;
                    summary.files_written = files.len() as u64;
                    summary.bytes_written = files.iter().map(|f| f.bytes.len() as u64).sum();
                    summary.dead_letters_by_kind = decoded
                        .rejected_by_kind
                        .iter()
                        .map(|(k, n)| (k.as_str().to_string(), *n))
                        .collect();
                    tracing::info!(
                        source = %source, first_offset = first, last_offset = last,
                        accepted = decoded.accepted, dead_lettered = decoded.rejected,
                        already_seen = summary.already_seen, files = files.len(),
                        checkpoint_version = cp.version, next_offset = cp.next_offset,
                        "partition landed"
                    );
                    return Ok(summary);
                }
                Advance::Conflict => {
                    summary.conflicts += 1;
                    tracing::warn!(source = %source, version = checkpoint.version,
                        "checkpoint moved under this invocation; re-planning");
                }
            }
        }
        Err(Error::CheckpointContention {
            source_partition: source.to_string(),
            attempts: self.options.max_attempts,
        })
    }

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
        let mut records = records.to_vec();
        records.sort_by_key(|r| r.offset);
        records.dedup_by_key(|r| r.offset);
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Ok(Some(IngestSummary::default()));
        };
        let (first, last) = (first.offset, last.offset);
        let (files, decoded) = self.encode_partition(source, &records, first, last).await?;
        join_all(
            files
                .iter()
                .map(|f| self.warehouse.write(&f.location, f.bytes.clone())),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
        let batch = self.pending_batch(source, first, last, &files).await?;
        if !self.state.add_pending(&batch, lock, holder).await? {
            return Ok(None);
        }
        Ok(Some(IngestSummary {
            records: records.len() as u64,
            accepted: decoded.accepted,
            dead_lettered: decoded.rejected,
            files_written: files.len() as u64,
            bytes_written: files.iter().map(|f| f.bytes.len() as u64).sum(),
            partitions: 1,
            ..Default::default()
        }))
    }

    /// Decodes the new records of a partition and encodes them as files (CPU only).
    async fn encode_partition(
        &self,
        source: &SourcePartition,
        records: &[&EsmRecord],
        first: i64,
        last: i64,
    ) -> Result<(Vec<EncodedFile>, records::Decoded)> {
        let table = self.topics.get(&source.topic);
        let mut dead =
            DeadLetterBuilder::new(self.dead_letters.clone(), self.clock.now_ms() * 1000);
        let decoded = records::decode_records(
            table,
            records,
            source,
            self.options.max_record_bytes,
            &mut dead,
        )?;
        let stem = format!(
            "{}-{}-{first:020}-{last:020}",
            crate::partition::topic_in_name(&source.topic),
            source.partition
        );
        let mut files = Vec::new();
        if let (Some(rows), Some(t)) = (&decoded.rows, table) {
            files.extend(encode::encode(&t.layout, rows, &t.location, &stem, &self.props).await?);
        }
        if let Some(rows) = &decoded.dead_letters {
            files.extend(
                encode::encode(
                    &self.dead_letters,
                    rows,
                    &self.dead_letter_location,
                    &stem,
                    &self.props,
                )
                .await?,
            );
        }
        Ok((files, decoded))
    }

    /// The pending record of the files, spilled to the warehouse when too large to keep inline.
    async fn pending_batch(
        &self,
        source: &SourcePartition,
        first: i64,
        last: i64,
        files: &[EncodedFile],
    ) -> Result<PendingBatch> {
        let mut pending = Vec::with_capacity(files.len());
        for f in files {
            let layout = if f.table == DEAD_LETTER_TABLE {
                &self.dead_letters
            } else {
                &self
                    .topics
                    .get(&source.topic)
                    .ok_or_else(|| Error::Internal(format!("no table for topic {}", source.topic)))?
                    .layout
            };
            pending.push(PendingFile {
                table: f.table.clone(),
                data_file: f.data_file_json(layout)?,
                rows: f.data_file.record_count(),
                bytes: f.bytes.len() as u64,
                partitioning: Some(layout.partitioning()),
            });
        }
        let mut batch = PendingBatch {
            source: source.clone(),
            first_offset: first,
            last_offset: last,
            created_at_ms: self.clock.now_ms(),
            files: pending,
            files_location: None,
        };
        let json = serde_json::to_vec(&batch.files)
            .map_err(|e| Error::Internal(format!("pending files: {e}")))?;
        if json.len() > self.options.max_inline_files_bytes {
            let hash = xxhash_rust::xxh3::xxh3_64(&json);
            let location = format!(
                "{}/_pending/{}/{}/{first:020}-{last:020}-{hash:016x}.json",
                self.warehouse.root(),
                crate::partition::topic_in_name(&source.topic),
                source.partition
            );
            self.warehouse.write(&location, json.into()).await?;
            batch.files.clear();
            batch.files_location = Some(location);
        }
        Ok(batch)
    }
}

/// Groups an event's records by topic-partition. Each record's own topic and partition count;
/// the map key (`topic-partition`) names the topic when a record lacks one. An event with a
/// negative or oversized partition, or a negative offset, is not an MSK event and is refused.
pub fn group_by_partition(event: &EsmEvent) -> Result<BTreeMap<SourcePartition, Vec<&EsmRecord>>> {
    let mut groups: BTreeMap<SourcePartition, Vec<&EsmRecord>> = BTreeMap::new();
    for (key, records) in &event.records {
        for r in records {
            let topic = match &r.topic {
                Some(t) => t.clone(),
                None => key
                    .rsplit_once('-')
                    .map_or(key.as_str(), |(t, _)| t)
                    .to_string(),
            };
            let partition = i32::try_from(r.partition)
                .ok()
                .filter(|p| *p >= 0)
                .ok_or_else(|| Error::Event {
                    origin: key.clone(),
                    message: format!(
                        "partition {} of offset {} is not a Kafka partition number",
                        r.partition, r.offset
                    ),
                })?;
            // A negative offset is no Kafka offset: below every checkpoint, such a record
            // would be dropped as already seen.
            if r.offset < 0 {
                return Err(Error::Event {
                    origin: key.clone(),
                    message: format!(
                        "offset {} of partition {partition} is not a Kafka offset",
                        r.offset
                    ),
                });
            }
            groups
                .entry(SourcePartition::new(topic, partition))
                .or_default()
                .push(r);
        }
    }
    Ok(groups)
}

/// Randomised exponential backoff: 10 ms × 2^attempt, jittered to between half and all of it.
fn backoff(attempt: u32) -> std::time::Duration {
    crate::clock::jitter(10u64 << attempt.min(6))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(partition: i64, offset: i64) -> EsmEvent {
        serde_json::from_str(&format!(
            r#"{{"records":{{"orders-0":[{{"topic":"orders","partition":{partition},"offset":{offset},"timestamp":1}}]}}}}"#
        ))
        .expect("event")
    }

    #[test]
    fn options_come_from_the_spec_and_the_environment() {
        let spec = PipelineSpec::parse(crate::config::BUILTIN_PIPELINE, std::path::Path::new("p"))
            .expect("spec");
        let o = IngestOptions::from_lookup(&spec, |k| match k {
            "STREAMTABLE_INGEST_ZSTD_LEVEL" => Some("3".into()),
            _ => None,
        })
        .expect("options");
        assert_eq!((o.zstd_level, o.max_attempts), (3, MAX_ATTEMPTS));
        assert_eq!(o.max_record_bytes, spec.settings.max_record_bytes);
        let err = IngestOptions::from_lookup(&spec, |k| {
            (k == "STREAMTABLE_INGEST_MAX_ATTEMPTS").then(|| "0".into())
        })
        .expect_err("zero attempts");
        assert!(err.to_string().contains("from 1 to 100"), "{err}");
    }

    #[test]
    fn records_without_kafka_coordinates_are_refused_not_dropped() {
        // Found by fuzzing: offset -1 lay below every checkpoint and was counted as already seen.
        let err = group_by_partition(&event(0, -1)).expect_err("negative offset");
        assert!(err.to_string().contains("not a Kafka offset"), "{err}");
        assert!(group_by_partition(&event(-3, 5)).is_err());
        assert!(group_by_partition(&event(1 << 40, 5)).is_err());
        let valid = event(2, 0);
        let groups = group_by_partition(&valid).expect("valid");
        assert_eq!(
            groups.keys().next(),
            Some(&SourcePartition::new("orders", 2))
        );
    }
}
