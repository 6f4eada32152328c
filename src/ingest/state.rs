//! The state of stateful derived tables (windows, dedup) per partition: read with the
//! checkpoints, run through the batch, written back in the same conditional write. A state
//! larger than the state item holds is written to the warehouse under a name of its own
//! (`_state/partitions/{topic}/{partition}/{next offset}-{seq}-{content hash}.state`) and the
//! item refers to it.

use std::collections::HashMap;

use super::{Ingestor, Planned};
use crate::checkpoint::{SourcePartition, StoredState};
use crate::error::Result;
use crate::process::state::PartitionState;
use crate::storage::Warehouse;

/// Default: encoded states larger than this are written to the warehouse instead of the item.
pub const MAX_INLINE_STATE_BYTES: usize = 300 * 1024;

/// The states of one attempt's stateful partitions.
#[derive(Default)]
pub(super) struct Loaded {
    /// Decoded, to run the batch on (updated by it).
    pub states: HashMap<SourcePartition, PartitionState>,
    /// As stored (their `seq` conditions the write).
    pub stored: HashMap<SourcePartition, StoredState>,
}

/// The decoded state `stored` holds (inline, or in the `warehouse` object it names).
pub async fn read_stored_state(
    warehouse: &Warehouse,
    source: &SourcePartition,
    stored: &StoredState,
) -> Result<PartitionState> {
    let bytes = match (&stored.body, &stored.location) {
        (Some(b), _) => b.clone(),
        (None, Some(location)) => warehouse.read(location).await?.to_vec(),
        (None, None) => Vec::new(),
    };
    if bytes.is_empty() {
        Ok(PartitionState::default())
    } else {
        PartitionState::decode(&bytes, &format!("partition {source}"))
    }
}

impl Ingestor {
    /// Whether derived tables of `topic` keep state per partition.
    pub(super) fn is_stateful_topic(&self, topic: &str) -> bool {
        self.topics
            .get(topic)
            .is_some_and(|t| self.processor.is_stateful(&t.spec.name))
    }

    /// Reads the states of the stateful partitions of `planned`. `Ok(None)` when a state is
    /// ahead of the checkpoint read before it (another invocation advanced in between): the
    /// group is re-planned.
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
            // Taken out, not cloned (dedup keys make a state large): a batch that does not
            // advance leaves no entry, and the next one reads the stored state.
            let cached = self.state_cache.lock().ok().and_then(|mut c| {
                c.remove(&p.source)
                    .filter(|(seq, _)| *seq == stored.seq)
                    .map(|(_, s)| s)
            });
            let state = match cached {
                Some(state) => state,
                None => self.read_state(&p.source, &stored).await?,
            };
            loaded.states.insert(p.source.clone(), state);
            loaded.stored.insert(p.source.clone(), stored);
        }
        Ok(Some(loaded))
    }

    /// The decoded state `stored` holds (inline, or in the warehouse object it names).
    pub(super) async fn read_state(
        &self,
        source: &SourcePartition,
        stored: &StoredState,
    ) -> Result<PartitionState> {
        read_stored_state(&self.warehouse, source, stored).await
    }

    /// The stored form of `planned[i]`'s state after the batch, written to the warehouse first
    /// when too large for the item.
    pub(super) async fn state_write(
        &self,
        p: &Planned<'_>,
        loaded: &Loaded,
    ) -> Result<Option<StoredState>> {
        let Some(state) = loaded.states.get(&p.source) else {
            return Ok(None);
        };
        let seq = loaded.stored.get(&p.source).map_or(0, |s| s.seq) + 1;
        self.encode_state(&p.source, p.next_offset, seq, state)
            .await
            .map(Some)
    }

    /// The stored form of a partition's `state` at `next_offset` and `seq`, written to the
    /// warehouse first when too large for the item.
    pub(super) async fn encode_state(
        &self,
        source: &SourcePartition,
        next_offset: i64,
        seq: u64,
        state: &PartitionState,
    ) -> Result<StoredState> {
        let body = state.encode()?;
        let bytes = body.len() as u64;
        let (body, location) = if body.len() > self.options.max_inline_state_bytes {
            // The content hash in the name: a losing duplicate invocation writes the same
            // (next, seq) with other bytes (another clock), and must never replace the object
            // the winner's committed item names.
            let location = format!(
                "{}/_state/partitions/{}/{}/{:020}-{seq:010}-{:016x}.state",
                self.warehouse.root(),
                crate::partition::topic_in_name(&source.topic),
                source.partition,
                next_offset,
                xxhash_rust::xxh3::xxh3_64(&body)
            );
            self.warehouse.write(&location, body.into()).await?;
            (None, Some(location))
        } else {
            (Some(body), None)
        };
        Ok(StoredState {
            next_offset,
            seq,
            body,
            location,
            bytes,
            updated_at_ms: self.clock.now_ms(),
        })
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
                    super::encode::encode(&d.layout, rows, location, &stem, &self.props).await?,
                );
            }
        }
        Ok(files)
    }

    /// Keeps the states an advance wrote, decoded, for the next batch of their partitions in
    /// this process (a state is identified by its partition and `seq`: each is written once).
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
    }

    /// Deletes the warehouse objects of states the advance replaced (best effort: orphan
    /// clean-up would not know them).
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
            if a.state.as_ref().and_then(|s| s.location.as_ref()) == Some(old) {
                continue;
            }
            if let Err(e) = self.warehouse.delete(old).await {
                tracing::warn!(location = %old, error = %e, "replaced partition state not deleted");
            }
        }
    }
}
