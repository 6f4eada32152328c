//! Ingest: one MSK event-source-mapping batch to Parquet micro-files, exactly once.
//!
//! For all the topic-partitions of a batch together (see [`crate::checkpoint`] for the
//! protocol):
//! 1. read their checkpoints and drop records below them;
//! 2. decode the rest; rejected records become dead letters;
//! 3. encode one Parquet file per table and partition value (whatever the number of Kafka
//!    partitions: the Kafka coordinates are columns), and one for `dead_letters`; upload them;
//! 4. advance every checkpoint and record the files as ONE pending batch, in one conditional
//!    write.
//!
//! If the conditional write loses (a duplicate or zombie invocation advanced one of the
//! partitions first), the batch is re-planned from the new checkpoints; usually nothing is left
//! to do. Files written by the loser are never referenced and are removed later by orphan
//! clean-up.

mod batch;
mod build;
mod derive;
mod idle;
mod layouts;
pub use layouts::Resolved;
mod live;
pub use live::{LiveIngestor, SpecLoader};
mod options;
mod pending;
mod records;
mod replayed;
mod reset;
pub use reset::PartitionReset;
mod schemas;
mod state_files;
mod summary;
mod tombstones;

use batch::Planned;
pub use batch::group_by_partition;
pub use idle::IdleFlush;
pub use options::IngestOptions;
pub use state_files::{
    Files as StateFiles, MAX_INLINE_STATE_BYTES, read_header, read_stored_state, state_files_in_use,
};
pub use summary::IngestSummary;
use tombstones::KeyDeletes;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::esm::{EsmEvent, EsmRecord};
use parquet::file::properties::WriterProperties;

use crate::checkpoint::{Advance, Checkpoint, SourceAdvance, SourcePartition, plan};
use crate::clock::Clock;
use crate::decode::{DeadLetterBuilder, Decoder, RowBuilder};
use crate::error::{Error, Result};
use crate::process::Processor;
use crate::process::partition_state::PartitionState;
use crate::schema::TableLayout;
use crate::spec::TableSpec;
use crate::storage::Warehouse;
use crate::store::StateStore;
use crate::table::encode::{self, EncodedFile};

/// Default: most topic-partitions landed together as one batch (the state store may split
/// further, see [`crate::store::CheckpointStore::groups`]).
pub const MAX_PARTITIONS_PER_BATCH: usize = 4096;
/// Default: how often a partition is re-planned after losing the conditional write.
pub const MAX_ATTEMPTS: u32 = 8;
/// Default: file lists larger than this are written to the warehouse instead of the state item.
pub const MAX_INLINE_FILES_BYTES: usize = 300 * 1024;

/// What [`Ingestor::encode_event_counted`] produced.
#[derive(Debug, Default)]
pub struct EncodedEvent {
    /// Records processed (each distinct offset once).
    pub records: u64,
    /// The encoded files of every table.
    pub files: Vec<EncodedFile>,
    /// Dead letters written for a derived table (its SQL failed on a record, a window's
    /// lateness, an event time too far ahead), on top of the record's own row.
    pub transform_failures: u64,
    /// Rows dropped by derived tables' dedup.
    pub deduplicated: u64,
    /// Encoded size of each stateful partition's state after the event, bytes.
    pub state_bytes: Vec<u64>,
}

/// A table fed by a topic, with what decoding and writing it needs.
pub(crate) struct TopicTable {
    pub spec: TableSpec,
    pub layout: Arc<TableLayout>,
    pub decoder: Decoder,
    /// An Avro upsert table's decoder of registry-framed keys (tombstones, deletes).
    pub key_decoder: Option<Arc<crate::decode::avro::AvroDecoder>>,
    pub location: String,
}

/// The ingest handler. Build once per process; [`Ingestor::handle`] once per batch.
pub struct Ingestor {
    topics: HashMap<String, TopicTable>,
    /// The derived tables, planned.
    processor: Processor,
    /// Every table's layout (topics' tables, derived tables) by name.
    layouts: HashMap<String, Arc<TableLayout>>,
    /// Every derived table's location by name.
    derived_locations: HashMap<String, String>,
    dead_letters: Arc<TableLayout>,
    dead_letter_location: String,
    options: IngestOptions,
    warehouse: Warehouse,
    state: Arc<dyn StateStore>,
    props: WriterProperties,
    clock: Arc<dyn Clock>,
    /// The decoded state this process last wrote per partition, with its `seq`: a warm
    /// container skips reading and decoding a state it wrote itself.
    state_cache: std::sync::Mutex<
        HashMap<
            crate::checkpoint::SourcePartition,
            (u64, crate::process::partition_state::PartitionState),
        >,
    >,
    /// The entries of the runs those states name, by state file, partition and block.
    run_cache: std::sync::Mutex<state_files::RunCache>,
    /// Topics whose table (or a derived table of theirs) the catalog refused, with the reason:
    /// their records are not written until the spec and the table agree again.
    refused: HashMap<String, (String, String)>,
    /// Where Avro topics' writer schemas come from.
    registries: crate::registry::Registries,
    /// (table, writer schema) pairs with new fields that already made the spec be read again:
    /// shared by the ingestors a [`LiveIngestor`] builds, so that a field the registry's latest
    /// version lacks fails one attempt, not every one.
    registry_reloads: RegistryReloads,
}

/// The (table, writer schema) pairs that made an ingestor's spec be read again.
pub type RegistryReloads =
    std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>;

impl Ingestor {
    /// Lands one ESM batch: the new records of all its topic-partitions (in as few groups as
    /// the state store's transactions allow) as one file per table and partition value, and
    /// their checkpoints advanced in one conditional write with one pending batch. Returns an
    /// error only when some partitions could not be landed; those that were stay landed, and a
    /// retry skips them by their checkpoints.
    pub async fn handle(&self, event: &EsmEvent) -> Result<IngestSummary> {
        self.processor.refresh(self.clock.now_ms()).await?;
        let (groups, mut first_error) = self.without_refused(group_by_partition(event)?);
        let mut total = IngestSummary::default();
        let sources: Vec<SourcePartition> = groups.iter().map(|(s, _)| s.clone()).collect();
        let stateful: Vec<bool> = sources
            .iter()
            .map(|s| self.is_stateful_topic(&s.topic))
            .collect();
        let mut chunks = Vec::new();
        let mut at = 0;
        for size in self.state.groups(&sources, &stateful).await? {
            let end = (at + size).min(groups.len());
            chunks.extend(groups[at..end].chunks(self.options.max_partitions_per_batch.max(1)));
            at = end;
        }
        for chunk in chunks {
            match self.ingest_group(chunk).await {
                Ok(s) => total.add(&s),
                Err(e) => {
                    tracing::error!(error = %e, retryable = e.is_retryable(),
                        partitions = chunk.len(), first = %chunk[0].0, "partitions not landed");
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
        let e = self.encode_event_counted(event).await?;
        Ok((e.records, e.files))
    }

    /// [`Ingestor::encode_event`], with the records dead-lettered by a derived table's SQL
    /// counted (they also landed in their topic's table).
    pub async fn encode_event_counted(&self, event: &EsmEvent) -> Result<EncodedEvent> {
        self.processor.refresh(self.clock.now_ms()).await?;
        let mut out = EncodedEvent::default();
        let groups: Vec<(SourcePartition, Vec<&EsmRecord>)> =
            group_by_partition(event)?.into_iter().collect();
        for chunk in groups.chunks(self.options.max_partitions_per_batch.max(1)) {
            let planned: Vec<Planned> = chunk
                .iter()
                .filter_map(|(source, group)| Planned::new(source, Checkpoint::INITIAL, group))
                .collect();
            if planned.is_empty() {
                continue;
            }
            out.records += planned.iter().map(|p| p.records.len() as u64).sum::<u64>();
            let mut states: HashMap<SourcePartition, PartitionState> = planned
                .iter()
                .filter(|p| self.is_stateful_topic(&p.source.topic))
                .map(|p| (p.source.clone(), PartitionState::default()))
                .collect();
            let (files, counts) = self.encode_group(&planned, &mut states).await?;
            for s in states.values() {
                out.state_bytes.push(s.stored_bytes());
            }
            out.deduplicated += counts.deduplicated;
            out.files.extend(files);
            out.transform_failures += counts
                .rejected_by_kind
                .iter()
                .filter(|(k, _)| {
                    use crate::decode::RejectKind as K;
                    matches!(k, K::Transform | K::Late | K::Future)
                })
                .map(|(_, n)| n)
                .sum::<u64>();
        }
        Ok(out)
    }

    async fn ingest_group(
        &self,
        group: &[(SourcePartition, Vec<&EsmRecord>)],
    ) -> Result<IngestSummary> {
        let mut summary = IngestSummary {
            records: group.iter().map(|(_, r)| r.len() as u64).sum(),
            partitions: group.len() as u64,
            newest_timestamp_ms: group
                .iter()
                .flat_map(|(_, rs)| rs.iter().map(|r| r.timestamp))
                .max(),
            ..Default::default()
        };
        let sources: Vec<SourcePartition> = group.iter().map(|(s, _)| s.clone()).collect();
        for attempt in 0..self.options.max_attempts {
            if attempt > 0 {
                // Two invocations that collided must not collide again in lockstep.
                tokio::time::sleep(backoff(attempt)).await;
            }
            let checkpoints = self.state.checkpoints(&sources).await?;
            for ((source, records), cp) in group.iter().zip(&checkpoints) {
                let stamps = records.iter().map(|r| (r.offset, r.timestamp));
                if let Some(r) = crate::checkpoint::recreated(cp, stamps) {
                    return Err(Error::Recreated {
                        source_partition: source.to_string(),
                        message: recreated_message(source, cp, &r),
                    });
                }
            }
            let mut planned = Vec::new();
            let mut already_seen = 0u64;
            for ((source, records), cp) in group.iter().zip(checkpoints) {
                let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
                already_seen += plan(cp, &offsets).already_seen as u64;
                planned.extend(Planned::new(source, cp, records));
            }
            summary.already_seen = already_seen;
            if planned.is_empty() {
                return Ok(summary);
            }
            let Some(mut loaded) = self.load_states(&planned).await? else {
                summary.conflicts += 1;
                continue;
            };
            let (files, counts) = self.encode_group(&planned, &mut loaded.states).await?;
            let carry = self.carriable(&files).await?;
            let (writes, carried) = self.state_writes(&planned, &mut loaded, carry).await?;
            self.write_files(&files, &carried).await?;
            let batch = self.pending_batch(&planned, &files, &carried).await?;
            let mut advances: Vec<SourceAdvance> = Vec::with_capacity(planned.len());
            let mut state_bytes_max = 0;
            for (p, state) in planned.iter().zip(writes) {
                state_bytes_max = state.as_ref().map_or(0, |s| s.bytes).max(state_bytes_max);
                advances.push(SourceAdvance {
                    source: p.source.clone(),
                    from: p.checkpoint,
                    to_next_offset: p.next_offset,
                    newest_ms: p.records.iter().map(|r| r.timestamp).max().unwrap_or(-1),
                    first_offset: p.first_offset(),
                    state,
                });
            }
            match self.state.advance(&advances, &batch).await? {
                Advance::Advanced => {
                    summary.accepted = counts.accepted;
                    summary.dead_lettered = counts.rejected;
                    summary.derived_rows = counts.derived_rows;
                    summary.deduplicated = counts.deduplicated;
                    summary.key_deletes = counts.key_deletes;
                    summary.state_bytes_max = state_bytes_max;
                    self.drop_replaced_states(&loaded, &advances).await;
                    self.remember_states(loaded, &advances);
                    summary.files_written = (files.len() - carried.len()) as u64;
                    summary.files_carried = carried.len() as u64;
                    summary.bytes_written = files
                        .iter()
                        .enumerate()
                        .filter(|(at, _)| !carried.contains_key(at))
                        .map(|(_, f)| f.bytes.len() as u64)
                        .sum();
                    summary.dead_letters_by_kind = counts
                        .rejected_by_kind
                        .iter()
                        .map(|(k, n)| (k.as_str().to_string(), *n))
                        .collect();
                    summary.derived_dead_lettered = counts.derived_rejected;
                    summary.derived_dead_letters_by_kind = counts
                        .derived_rejected_by_kind
                        .iter()
                        .map(|(k, n)| (k.as_str().to_string(), *n))
                        .collect();
                    tracing::info!(
                        partitions = planned.len(), first = %planned[0].source,
                        accepted = counts.accepted, dead_lettered = counts.rejected,
                        already_seen = summary.already_seen, files = files.len(),
                        "batch landed"
                    );
                    return Ok(summary);
                }
                Advance::Conflict => {
                    summary.conflicts += 1;
                    tracing::warn!(partitions = planned.len(), first = %planned[0].source,
                        "a checkpoint moved under this invocation; re-planning");
                }
            }
        }
        Err(Error::CheckpointContention {
            source_partition: sources.first().map(ToString::to_string).unwrap_or_default(),
            attempts: self.options.max_attempts,
        })
    }

    /// Decodes the planned records of every partition of a group and encodes them as one file
    /// per table and partition value (CPU only). Files are named after the group's first
    /// partition and its offsets.
    async fn encode_group(
        &self,
        planned: &[Planned<'_>],
        states: &mut HashMap<SourcePartition, PartitionState>,
    ) -> Result<(Vec<EncodedFile>, records::Counts)> {
        self.check_refused(planned)?;
        self.resolve_schemas(planned).await?;
        let mut dead =
            DeadLetterBuilder::new(self.dead_letters.clone(), self.clock.now_ms() * 1000);
        let mut counts = records::Counts::default();
        let mut builders: BTreeMap<&str, RowBuilder> = BTreeMap::new();
        let mut tombstones: BTreeMap<&str, KeyDeletes> = BTreeMap::new();
        for p in planned {
            let table = self.topics.get(&p.source.topic);
            let topic = p.source.topic.as_str();
            if let Some(t) = table
                && !builders.contains_key(topic)
            {
                let capacity = planned
                    .iter()
                    .filter(|q| q.source.topic == p.source.topic)
                    .map(|q| q.records.len())
                    .sum();
                builders.insert(topic, RowBuilder::new(&t.spec, t.layout.clone(), capacity)?);
                if let Some(k) = KeyDeletes::new(&t.spec, &t.layout, 0)? {
                    tombstones.insert(topic, k.with_framed_keys(t.key_decoder.clone()));
                }
            }
            records::decode_records(
                table,
                builders.get_mut(topic),
                tombstones.get_mut(topic),
                &p.records,
                &p.source,
                self.options.max_record_bytes,
                &mut dead,
                &mut counts,
            );
        }
        let first = &planned[0];
        let stem = format!(
            "{}-{}-{:020}-{:020}",
            crate::partition::topic_in_name(&first.source.topic),
            first.source.partition,
            first.first_offset(),
            first.last_offset()
        );
        let mut files = Vec::new();
        for (topic, mut keys) in tombstones {
            let Some(t) = self.topics.get(topic) else {
                continue;
            };
            if keys.rows.is_empty() {
                continue;
            }
            let batch = keys.rows.finish()?;
            // Named as the batch's data files are (content-named, under `data/`), so that
            // orphan clean-up tells its partition and offsets as it does theirs.
            for mut f in
                encode::encode(&keys.layout, &batch, &t.location, &stem, &self.props).await?
            {
                f.key_deletes = true;
                files.push(f);
            }
        }
        for (topic, mut rows) in builders {
            let Some(t) = self.topics.get(topic) else {
                continue;
            };
            if rows.is_empty() {
                continue;
            }
            let batch = rows.finish()?;
            if t.spec.land {
                files.extend(
                    encode::encode(&t.layout, &batch, &t.location, &stem, &self.props).await?,
                );
            }
            let out = derive::Output {
                locations: &self.derived_locations,
                stem: &stem,
                props: &self.props,
            };
            let mut topic_states: BTreeMap<i32, PartitionState> = BTreeMap::new();
            let keys: Vec<SourcePartition> = states
                .keys()
                .filter(|s| s.topic == topic)
                .cloned()
                .collect();
            for k in &keys {
                if let Some(s) = states.remove(k) {
                    topic_states.insert(k.partition, s);
                }
            }
            files.extend(
                derive::derived_files(
                    &self.processor,
                    &out,
                    &t.spec.name,
                    topic,
                    &batch,
                    planned,
                    &mut topic_states,
                    self.clock.now_ms(),
                    &mut dead,
                    &mut counts,
                )
                .await?,
            );
            for (partition, s) in topic_states {
                states.insert(SourcePartition::new(topic, partition), s);
            }
        }
        if !dead.is_empty() {
            let batch = dead.finish()?;
            files.extend(
                encode::encode(
                    &self.dead_letters,
                    &batch,
                    &self.dead_letter_location,
                    &stem,
                    &self.props,
                )
                .await?,
            );
        }
        Ok((files, counts))
    }
}

/// Randomised exponential backoff: 10 ms × 2^attempt, jittered to between half and all of it.
fn backoff(attempt: u32) -> std::time::Duration {
    crate::clock::jitter(10u64 << attempt.min(6))
}

/// What [`Error::Recreated`] says: the offsets, the stamps, and the way on.
pub fn recreated_message(
    source: &SourcePartition,
    checkpoint: &crate::checkpoint::Checkpoint,
    r: &crate::checkpoint::Recreated,
) -> String {
    format!(
        "offsets {}..={} ({} records) are below the checkpoint {} yet stamped up to {}, after the latest record the partition took ({}): the topic was deleted and created again, its offsets restarting. Nothing of the partition lands until it is moved to the new log: `streamtable reset-partition {} {} --recreated --from {}` (README, \"A topic deleted and created again\")",
        r.offsets[0],
        r.offsets[1],
        r.records,
        checkpoint.next_offset,
        crate::clock::rfc3339_ms(r.stamped_ms),
        crate::clock::rfc3339_ms(checkpoint.newest_ms),
        source.topic,
        source.partition,
        checkpoint.next_offset
    )
}
