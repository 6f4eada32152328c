//! The state of stateful derived tables (windows, dedup) per partition: read with the
//! checkpoints, run through the batch, written back in the same conditional write.
//!
//! A batch writes what it changed, once: the sections of every partition of a topic it touched
//! go into one state file (`_state/partitions/{topic}/runs/{content hash}.run`, see
//! [`crate::process::partition_state`]), written before the transaction that names it; a section that
//! adds no dedup keys and is small enough is kept in the state item instead. A losing
//! duplicate's or a crashed invocation's file is named by no item: never read, and deleted by
//! orphan clean-up. Runs never change, so a warm container keeps their entries by name and
//! reads nothing but what other containers wrote.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;

use super::{Ingestor, Planned};
use crate::checkpoint::{CarriedRows, SourcePartition, StoredState};
use crate::error::{Error, Result};
use crate::process::partition_state::keys::{Entry, LazyFilter};
use crate::process::partition_state::{PartitionState, StateFile, decode_file};
use crate::storage::Warehouse;

/// Default: a section that adds no dedup keys is kept in the state item when it encodes to at
/// most this many bytes (the item's write costs a unit per KB).
pub const MAX_INLINE_STATE_BYTES: usize = 1024;

/// The most a section kept in its item may encode to, whatever the option says.
const MAX_INLINE_STATE_CAP: usize = 32 * 1024;

/// State files read at once by a cold container.
const PARALLEL_READS: usize = 8;

/// The states of one attempt's stateful partitions.
#[derive(Default)]
pub(super) struct Loaded {
    /// Decoded, to run the batch on (updated by it).
    pub states: HashMap<SourcePartition, PartitionState>,
    /// As stored (their `seq` conditions the write).
    pub stored: HashMap<SourcePartition, StoredState>,
}

/// Run entries kept by a warm container: (state file, partition, block) → entries.
pub(super) type RunCache = HashMap<(String, String, u32), CachedRun>;

/// A run's entries as a warm container keeps them, with its filter once built.
pub(super) type CachedRun = (Arc<Vec<Entry>>, LazyFilter);

/// The `topic/partition` a section is filed under.
fn section_key(source: &SourcePartition) -> String {
    format!("{}/{}", source.topic, source.partition)
}

/// Whether `location` is a state file of layout 4 (else a whole state of an earlier layout).
fn is_state_file(location: &str) -> bool {
    location.ends_with(".run")
}

/// State files read during one load (or one pass of the idle flush or clean-up), decoded.
#[derive(Default)]
pub struct Files(HashMap<String, BTreeMap<String, PartitionState>>);

impl Files {
    async fn get(
        &mut self,
        warehouse: &Warehouse,
        location: &str,
    ) -> Result<&BTreeMap<String, PartitionState>> {
        if !self.0.contains_key(location) {
            let bytes = warehouse.read(location).await?;
            let decoded = decode_file(&bytes, location)?;
            self.0.insert(location.to_string(), decoded);
        }
        self.0
            .get(location)
            .ok_or_else(|| Error::Internal(format!("state file {location} not kept")))
    }

    /// Reads every file of `locations` not read yet, a few at a time.
    async fn read_all(&mut self, warehouse: &Warehouse, locations: Vec<String>) -> Result<()> {
        let missing: Vec<String> = locations
            .into_iter()
            .filter(|l| !self.0.contains_key(l))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let mut reads = futures::stream::iter(missing.into_iter().map(|l| async move {
            let bytes = warehouse.read(&l).await?;
            let decoded = decode_file(&bytes, &l)?;
            Ok::<_, Error>((l, decoded))
        }))
        .buffer_unordered(PARALLEL_READS);
        while let Some(read) = reads.next().await {
            let (l, decoded) = read?;
            self.0.insert(l, decoded);
        }
        Ok(())
    }
}

/// The decoded state `stored` holds (inline, in its state file, or in an object of an earlier
/// layout); the entries of runs in other files are not read.
pub async fn read_stored_state(
    warehouse: &Warehouse,
    source: &SourcePartition,
    stored: &StoredState,
) -> Result<PartitionState> {
    read_header(warehouse, &mut Files::default(), source, stored).await
}

/// [`read_stored_state`], with the state files already read in `files` (kept for the next).
pub async fn read_header(
    warehouse: &Warehouse,
    files: &mut Files,
    source: &SourcePartition,
    stored: &StoredState,
) -> Result<PartitionState> {
    let what = format!("partition {source}");
    match (&stored.body, &stored.location) {
        (Some(b), _) if !b.is_empty() => PartitionState::decode(b, &what),
        (_, Some(location)) if is_state_file(location) => {
            let key = section_key(source);
            files
                .get(warehouse, location)
                .await?
                .get(&key)
                .cloned()
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "{what}: its state file {location} has no section for it"
                    ))
                })
        }
        (_, Some(location)) => {
            let bytes = warehouse.read(location).await?;
            PartitionState::decode(&bytes, &what)
        }
        _ => Ok(PartitionState::default()),
    }
}

/// The state files a stored state needs (its own and those its runs are in): what orphan
/// clean-up must keep.
pub async fn state_files_in_use(
    warehouse: &Warehouse,
    files: &mut Files,
    source: &SourcePartition,
    stored: &StoredState,
) -> Result<Vec<String>> {
    let state = read_header(warehouse, files, source, stored).await?;
    let mut out: Vec<String> = state.files().map(str::to_string).collect();
    out.extend(stored.location.clone());
    Ok(out)
}

/// Fills in the entries of every run of `states` not in memory: from `cache`, else from their
/// state files (read in parallel, once each).
async fn load_runs(
    warehouse: &Warehouse,
    files: &mut Files,
    cache: impl Fn(&(String, String, u32)) -> Option<CachedRun>,
    states: &mut [(&SourcePartition, &mut PartitionState)],
) -> Result<()> {
    let mut wanted: Vec<String> = Vec::new();
    for (source, state) in states.iter_mut() {
        let key = section_key(source);
        // Runs are read only from the topic's own state files: a damaged or forged state
        // naming any other object is refused, never followed.
        let prefix = format!(
            "{}/_state/partitions/{}/runs/",
            warehouse.root(),
            crate::partition::topic_in_name(&source.topic)
        );
        for t in state.tables.values_mut() {
            for r in &mut t.keys.runs {
                if r.entries.is_some() {
                    continue;
                }
                let name = r.at.file.strip_prefix(&prefix).unwrap_or_default();
                if !name.ends_with(".run") || name.contains('/') {
                    return Err(Error::Internal(format!(
                        "partition {source}: its state names a run in {}, outside its state files ({prefix})",
                        r.at.file
                    )));
                }
                match cache(&(r.at.file.clone(), key.clone(), r.at.block)) {
                    Some((entries, filter)) => {
                        r.entries = Some(entries);
                        r.filter = filter;
                    }
                    None => wanted.push(r.at.file.clone()),
                }
            }
        }
    }
    if wanted.is_empty() {
        return Ok(());
    }
    files.read_all(warehouse, wanted).await?;
    for (source, state) in states.iter_mut() {
        let key = section_key(source);
        for (name, t) in &mut state.tables {
            for r in &mut t.keys.runs {
                if r.entries.is_some() {
                    continue;
                }
                let found = files
                    .0
                    .get(&r.at.file)
                    .and_then(|f| f.get(&key))
                    .and_then(|s| s.tables.get(name))
                    .and_then(|t| {
                        t.keys
                            .runs
                            .iter()
                            .find(|o| o.at.file == r.at.file && o.at.block == r.at.block)
                    })
                    .and_then(|o| o.entries.clone())
                    .filter(|e| e.len() as u64 == r.at.count);
                match found {
                    Some(e) => r.entries = Some(e),
                    None => {
                        return Err(Error::Internal(format!(
                            "partition {source}: dedup keys of {name} name block {} of {}, which it lacks",
                            r.at.block, r.at.file
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

impl Ingestor {
    /// Whether derived tables of `topic` keep state per partition.
    pub(super) fn is_stateful_topic(&self, topic: &str) -> bool {
        self.topics
            .get(topic)
            .is_some_and(|t| self.processor.is_stateful(&t.spec.name))
    }

    /// Reads the states of the stateful partitions of `planned`, every run's entries in memory.
    /// `Ok(None)` when a state is ahead of the checkpoint read before it (another invocation
    /// advanced in between): the group is re-planned.
    pub(super) async fn load_states(&self, planned: &[Planned<'_>]) -> Result<Option<Loaded>> {
        let sources: Vec<&Planned<'_>> = planned
            .iter()
            .filter(|p| self.is_stateful_topic(&p.source.topic))
            .collect();
        let mut loaded = Loaded::default();
        if sources.is_empty() {
            return Ok(Some(loaded));
        }
        let keys: Vec<SourcePartition> = sources.iter().map(|p| p.source.clone()).collect();
        let stored = self.state.partition_states(&keys).await?;
        let mut files = Files::default();
        for (p, stored) in sources.into_iter().zip(stored) {
            let Some(stored) = stored else {
                loaded
                    .states
                    .insert(p.source.clone(), PartitionState::default());
                continue;
            };
            if stored.next_offset > p.checkpoint.next_offset {
                return Ok(None);
            }
            if stored.next_offset < p.checkpoint.next_offset {
                tracing::warn!(partition = %p.source, state_at = stored.next_offset,
                    checkpoint = p.checkpoint.next_offset,
                    "the partition's state is behind its checkpoint (records landed without it); continuing from it");
            }
            // Taken out, not cloned: a batch that does not advance leaves no entry, and the
            // next one reads the stored state (its runs from the run cache).
            let cached = self.state_cache.lock().ok().and_then(|mut c| {
                c.remove(&p.source)
                    .filter(|(seq, _)| *seq == stored.seq)
                    .map(|(_, s)| s)
            });
            let state = match cached {
                Some(state) => state,
                None => read_header(&self.warehouse, &mut files, &p.source, &stored).await?,
            };
            loaded.states.insert(p.source.clone(), state);
            loaded.stored.insert(p.source.clone(), stored);
        }
        let cache =
            |k: &(String, String, u32)| self.run_cache.lock().ok().and_then(|c| c.get(k).cloned());
        let mut states: Vec<(&SourcePartition, &mut PartitionState)> =
            loaded.states.iter_mut().collect();
        load_runs(&self.warehouse, &mut files, cache, &mut states).await?;
        Ok(Some(loaded))
    }

    /// Reads the state of every partition of `topic` as a cold container would before its
    /// first batch, every run's entries included, into this ingestor's caches; the entries
    /// loaded (`bench state`).
    pub async fn load_topic_states(&self, topic: &str) -> Result<u64> {
        let mut files = Files::default();
        let mut states: Vec<(SourcePartition, StoredState, PartitionState)> = Vec::new();
        for (source, stored) in self.state.topic_states(topic).await? {
            let Some(stored) = stored else { continue };
            let state = read_header(&self.warehouse, &mut files, &source, &stored).await?;
            states.push((source, stored, state));
        }
        let mut refs: Vec<(&SourcePartition, &mut PartitionState)> =
            states.iter_mut().map(|(s, _, p)| (&*s, p)).collect();
        load_runs(&self.warehouse, &mut files, |_| None, &mut refs).await?;
        let entries = states
            .iter()
            .map(|(_, _, s)| s.tables.values().map(|t| t.keys.len()).sum::<u64>())
            .sum();
        if let Ok(mut cache) = self.state_cache.lock() {
            for (source, stored, state) in states {
                cache.insert(source, (stored.seq, state));
            }
        }
        Ok(entries)
    }

    /// The stored forms of the states of `planned` after the batch (by position; `None` for a
    /// partition without state): one state file per topic holding every section, written
    /// first, unless no section adds keys and each fits the item. The files of `carry` (by
    /// their position in the batch's files) ride in the first of those state files when there
    /// is one: returned by position, they are not to be written on their own.
    pub(super) async fn state_writes(
        &self,
        planned: &[Planned<'_>],
        loaded: &mut Loaded,
        carry: Vec<(usize, bytes::Bytes)>,
    ) -> Result<(Vec<Option<StoredState>>, HashMap<usize, CarriedRows>)> {
        let mut items: Vec<(SourcePartition, i64, u64)> = Vec::new();
        let mut at: Vec<Option<usize>> = Vec::with_capacity(planned.len());
        for p in planned {
            if loaded.states.contains_key(&p.source) {
                let seq = loaded.stored.get(&p.source).map_or(0, |s| s.seq) + 1;
                at.push(Some(items.len()));
                items.push((p.source.clone(), p.next_offset, seq));
            } else {
                at.push(None);
            }
        }
        let (written, carried) = self.write_states(&items, &mut loaded.states, carry).await?;
        let states = at
            .into_iter()
            .map(|i| i.map(|i| written[i].clone()))
            .collect();
        Ok((states, carried))
    }

    /// Seals the states of `items` (partition, next offset, seq) in `states`, writes their
    /// state files, and returns their stored forms in order, with where the rows of `carry`
    /// went (none when no state file is written). The states' new runs name their files
    /// afterwards.
    pub(super) async fn write_states(
        &self,
        items: &[(SourcePartition, i64, u64)],
        states: &mut HashMap<SourcePartition, PartitionState>,
        carry: Vec<(usize, bytes::Bytes)>,
    ) -> Result<(Vec<StoredState>, HashMap<usize, CarriedRows>)> {
        let mut sealed = Vec::with_capacity(items.len());
        for (source, _, _) in items {
            let state = states
                .get_mut(source)
                .ok_or_else(|| Error::Internal(format!("no state for {source}")))?;
            let section = state.seal(|table| self.processor.dedup_within_us(table))?;
            sealed.push(section);
        }
        // Per topic: a file when any section adds keys or outgrows the item.
        let mut filed: BTreeMap<&str, StateFile> = BTreeMap::new();
        // At most 32 KB inline whatever the option: a transaction holds up to
        // MAX_STATES_PER_TRANSACTION state items within DynamoDB's 4 MB.
        // And at most what the store keeps in its item (DynamoDB: 64 bytes, many partitions
        // to an item).
        let inline = self
            .options
            .max_inline_state_bytes
            .min(MAX_INLINE_STATE_CAP)
            .min(self.state.max_inline_state_bytes());
        for ((source, _, _), s) in items.iter().zip(&sealed) {
            if s.has_blocks || s.bytes.len() > inline {
                filed.entry(source.topic.as_str()).or_default();
            }
        }
        for ((source, _, _), s) in items.iter().zip(&sealed) {
            if let Some(f) = filed.get_mut(source.topic.as_str()) {
                f.add(&section_key(source), s)?;
            }
        }
        // The batch's small derived files ride in its first state file.
        let mut parts: Vec<(usize, &str, u32)> = Vec::new();
        if let Some((topic, file)) = filed.iter_mut().next() {
            for (at, rows) in carry {
                parts.push((at, *topic, file.add_rows(rows)));
            }
        }
        let mut locations: HashMap<&str, String> = HashMap::new();
        for (topic, file) in filed {
            let (bytes, hash) = file.finish()?;
            let location = format!(
                "{}/_state/partitions/{}/runs/{hash}.run",
                self.warehouse.root(),
                crate::partition::topic_in_name(topic),
            );
            self.warehouse.write(&location, bytes.into()).await?;
            locations.insert(topic, location);
        }
        let now = self.clock.now_ms();
        let mut out = Vec::with_capacity(items.len());
        for ((source, next_offset, seq), s) in items.iter().zip(sealed) {
            let state = states
                .get_mut(source)
                .ok_or_else(|| Error::Internal(format!("no state for {source}")))?;
            let (body, location) =
                match locations.get(source.topic.as_str()) {
                    Some(l) => {
                        state.placed(l);
                        (None, Some(l.clone()))
                    }
                    None => (
                        Some(zstd::bulk::compress(&s.bytes, 1).map_err(|e| {
                            Error::Internal(format!("compress partition state: {e}"))
                        })?),
                        None,
                    ),
                };
            out.push(StoredState {
                next_offset: *next_offset,
                seq: *seq,
                body,
                location,
                bytes: state.stored_bytes(),
                updated_at_ms: now,
            });
        }
        let mut carried = HashMap::with_capacity(parts.len());
        for (at, topic, part) in parts {
            let file = locations
                .get(topic)
                .ok_or_else(|| Error::Internal(format!("no state file of {topic}")))?
                .clone();
            carried.insert(at, CarriedRows { file, part });
        }
        Ok((out, carried))
    }
}

impl Ingestor {
    /// Closes every open window of `states` (replayed records' own states) into partial rows.
    pub(super) async fn close_all(
        &self,
        planned: &[Planned<'_>],
        states: &mut HashMap<SourcePartition, PartitionState>,
    ) -> Result<Vec<super::EncodedFile>> {
        let mut files = Vec::new();
        let Some(first) = planned.first() else {
            return Ok(files);
        };
        let stem = format!(
            "{}-{}-{:020}-{:020}-closed",
            crate::partition::topic_in_name(&first.source.topic),
            first.source.partition,
            first.first_offset(),
            first.last_offset()
        );
        for (source, state) in states.iter_mut() {
            let Some(t) = self.topics.get(&source.topic) else {
                continue;
            };
            for d in self.processor.close_all(
                &t.spec.name,
                source.partition,
                first.last_offset(),
                state,
            )? {
                let (Some(rows), Some(location)) = (&d.rows, self.derived_locations.get(&d.table))
                else {
                    continue;
                };
                files.extend(
                    crate::table::encode::encode(&d.layout, rows, location, &stem, &self.props)
                        .await?,
                );
            }
        }
        Ok(files)
    }

    /// Keeps the states an advance wrote, decoded, for the next batch of their partitions in
    /// this process (a state is identified by its partition and `seq`: each is written once),
    /// and their runs' entries by name (runs never change); entries no kept state names are
    /// let go.
    pub(super) fn remember_states(
        &self,
        mut loaded: Loaded,
        advances: &[crate::checkpoint::SourceAdvance],
    ) {
        let Ok(mut cache) = self.state_cache.lock() else {
            return;
        };
        for a in advances {
            if let (Some(written), Some(state)) = (&a.state, loaded.states.remove(&a.source)) {
                cache.insert(a.source.clone(), (written.seq, state));
            }
        }
        let Ok(mut runs) = self.run_cache.lock() else {
            return;
        };
        runs.clear();
        for (source, (_, state)) in cache.iter() {
            let key = section_key(source);
            for t in state.tables.values() {
                for r in &t.keys.runs {
                    if let Some(e) = &r.entries {
                        runs.insert(
                            (r.at.file.clone(), key.clone(), r.at.block),
                            (e.clone(), r.filter.clone()),
                        );
                    }
                }
            }
        }
    }

    /// Deletes the objects of states of an earlier layout the advance replaced (best effort:
    /// orphan clean-up deletes what is left). State files are shared by partitions and runs:
    /// only clean-up deletes them.
    pub(super) async fn drop_replaced_states(
        &self,
        loaded: &Loaded,
        advances: &[crate::checkpoint::SourceAdvance],
    ) {
        for a in advances {
            let Some(old) = loaded
                .stored
                .get(&a.source)
                .and_then(|s| s.location.as_ref())
            else {
                continue;
            };
            if is_state_file(old) || a.state.as_ref().and_then(|s| s.location.as_ref()) == Some(old)
            {
                continue;
            }
            if let Err(e) = self.warehouse.delete(old).await {
                tracing::warn!(location = %old, error = %e, "replaced partition state not deleted");
            }
        }
    }
}
