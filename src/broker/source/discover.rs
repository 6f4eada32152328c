//! Which partitions the local event source mapping reads, found again as topics gain them, and
//! what it does when a position falls outside a partition's log.

use super::*;

impl LocalEsm {
    /// Finds the topics' partitions and assigns the new ones: at their checkpoints, else at
    /// the starting position; forgets the partitions of a topic that is gone.
    pub(super) async fn discover(&mut self) -> Result<()> {
        let mut found: Vec<(String, i32)> = Vec::new();
        for topic in self.topics.clone() {
            let consumer = &self.consumer;
            let metadata = tokio::task::block_in_place(|| {
                consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))
            })
            .map_err(|e| kafka_error(&format!("read the metadata of topic {topic}"), e))?;
            let listed = metadata.topics().iter().find(|t| t.name() == topic);
            // Only a topic the cluster says it does not know is gone: another error (a leader
            // election, a controller moving) keeps its partitions as they are.
            let unknown = match listed.and_then(|t| t.error()) {
                None => listed.is_none_or(|t| t.partitions().is_empty()),
                Some(e) => {
                    rdkafka::types::RDKafkaErrorCode::from(e)
                        == rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition
                }
            };
            if !unknown && listed.and_then(|t| t.error()).is_some() {
                continue;
            }
            let partitions: Vec<i32> = listed
                .iter()
                .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                .collect();
            if unknown {
                if self.missing.insert(topic.clone()) {
                    eprintln!("topic {topic} does not exist (yet): waiting for it");
                }
                let gone: Vec<(String, i32)> = self
                    .positions
                    .keys()
                    .filter(|(t, _)| *t == topic)
                    .cloned()
                    .collect();
                if !gone.is_empty() {
                    let mut tpl = TopicPartitionList::new();
                    for (t, p) in &gone {
                        tpl.add_partition(t, *p);
                        self.positions.remove(&(t.clone(), *p));
                    }
                    let _ = self.consumer.incremental_unassign(&tpl);
                }
                continue;
            }
            self.missing.remove(&topic);
            for p in partitions {
                if !self.positions.contains_key(&(topic.clone(), p)) {
                    found.push((topic.clone(), p));
                }
            }
        }
        let latest = self.args.starting_position == StartingPosition::Latest && !self.discovered;
        if found.is_empty() {
            self.discovered = true;
            return Ok(());
        }
        let sources: Vec<SourcePartition> = found
            .iter()
            .map(|(t, p)| SourcePartition::new(t, *p))
            .collect();
        let mut checkpoints = self.backend.state.checkpoints(&sources).await?;
        if let Some((notes, spec)) = self.local_events.as_mut() {
            let moves = notes.to_move(&sources, &checkpoints)?;
            if !moves.is_empty() {
                let consumer = &self.consumer;
                let (backend, tables, options) = (&self.backend, &self.tables, &self.scheduled);
                let start = |topic: &str, p: i32| {
                    tokio::task::block_in_place(|| {
                        consumer.fetch_watermarks(topic, p, Duration::from_secs(10))
                    })
                    .map(|(low, _)| low.max(0))
                    .map_err(|e| kafka_error(&format!("read the start of {topic}/{p}"), e))
                };
                let land_pending = async || -> Result<()> {
                    let Some(tables) = tables else {
                        return Err(Error::Config(
                            "batches of local events are pending: run `streamtable scheduled` first"
                                .into(),
                        ));
                    };
                    eprintln!("landing the pending batches of local events first");
                    crate::scheduled::run(backend, tables, options)
                        .await
                        .map(|_| ())
                };
                for line in notes
                    .move_to_cluster(backend, spec, moves, start, land_pending)
                    .await?
                {
                    eprintln!("{line}");
                }
                checkpoints = self.backend.state.checkpoints(&sources).await?;
            }
            notes.note_cluster(&sources)?;
        }
        self.check_logs(&sources, &checkpoints)?;
        // LATEST, as a new mapping's: where a run before this one started (kept in the group's
        // offsets), else the end of the log now, kept in the group's offsets at once so that a
        // restart before anything lands does not skip what arrived in between.
        let group: BTreeMap<(String, i32), i64> = if latest {
            let mut tpl = TopicPartitionList::new();
            for (t, p) in &found {
                tpl.add_partition(t, *p);
            }
            let consumer = &self.consumer;
            tokio::task::block_in_place(|| consumer.committed_offsets(tpl, Duration::from_secs(10)))
                .map_err(|e| kafka_error("read the consumer group's offsets", e))?
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) if o >= 0 => {
                        Some(((e.topic().to_string(), e.partition()), o))
                    }
                    _ => None,
                })
                .collect()
        } else {
            BTreeMap::new()
        };
        // A topic some partition of which has a checkpoint or a kept position started before:
        // its other partitions appeared later and start at their beginning.
        let started: std::collections::BTreeSet<&String> = found
            .iter()
            .zip(&checkpoints)
            .filter(|((t, p), c)| c.version > 0 || group.contains_key(&(t.to_string(), *p)))
            .map(|((t, _), _)| t)
            .collect();
        let mut tpl = TopicPartitionList::new();
        let mut starts = TopicPartitionList::new();
        let mut assigned = Vec::new();
        for ((topic, p), c) in found.iter().zip(&checkpoints) {
            let start = if c.version > 0 {
                c.next_offset
            } else if latest {
                match group.get(&(topic.clone(), *p)) {
                    Some(o) => *o,
                    None if started.contains(topic) => -1,
                    None => {
                        let consumer = &self.consumer;
                        let (_, high) = tokio::task::block_in_place(|| {
                            consumer.fetch_watermarks(topic, *p, Duration::from_secs(10))
                        })
                        .map_err(|e| kafka_error(&format!("read the end of {topic}/{p}"), e))?;
                        let _ = starts.add_partition_offset(topic, *p, Offset::Offset(high));
                        high
                    }
                }
            } else {
                -1
            };
            let offset = if start >= 0 {
                Offset::Offset(start)
            } else {
                Offset::Beginning
            };
            tpl.add_partition_offset(topic, *p, offset)
                .map_err(|e| kafka_error("assign", e))?;
            assigned.push((
                (topic.clone(), *p),
                Position {
                    fetched: start,
                    landed: start,
                    committed: if latest { start } else { -1 },
                },
            ));
        }
        if starts.count() > 0 {
            let consumer = &self.consumer;
            tokio::task::block_in_place(|| consumer.commit(&starts, CommitMode::Sync))
                .map_err(|e| kafka_error("keep the starting position in the group", e))?;
        }
        self.consumer
            .incremental_assign(&tpl)
            .map_err(|e| kafka_error("assign the partitions", e))?;
        // Only now: a failure above leaves nothing half-assigned, and is tried again.
        let mut pause = TopicPartitionList::new();
        let mut ends = self.consumer.context().ends.lock().ok();
        for (key, position) in assigned {
            // A paused topic's new partitions are paused with the others.
            if self.paused.contains(&key.0) {
                pause.add_partition(&key.0, key.1);
            }
            // Statistics of an earlier assignment of the partition say nothing of this one.
            if let Some(ends) = ends.as_mut() {
                ends.remove(&key);
            }
            self.positions.insert(key, position);
        }
        drop(ends);
        if pause.count() > 0
            && let Err(e) = self.consumer.pause(&pause)
        {
            tracing::warn!(error = %e, "could not pause new partitions of a paused topic");
        }
        self.discovered = true;
        tracing::info!(partitions = found.len(), "assigned");
        Ok(())
    }

    /// Refuses to resume a partition whose log below its checkpoint holds records the
    /// partition never took (stamped after the latest it did: the topic was deleted and
    /// created again, its new log longer than the checkpoint), as ingest refuses such records
    /// when the event source delivers them ([`crate::checkpoint::recreated`]).
    fn check_logs(
        &self,
        sources: &[SourcePartition],
        checkpoints: &[crate::checkpoint::Checkpoint],
    ) -> Result<()> {
        /// Records read below each checkpoint.
        const PROBE: i64 = 16;
        let below: Vec<(String, i32, i64)> = sources
            .iter()
            .zip(checkpoints)
            .filter(|(_, c)| {
                c.version > 0 && c.newest_ms >= 0 && c.next_offset > c.first_offset.max(0)
            })
            .map(|(s, c)| (s.topic.clone(), s.partition, c.next_offset))
            .collect();
        if below.is_empty() {
            return Ok(());
        }
        let connection = &self.args.connection;
        let stamps = tokio::task::block_in_place(|| {
            crate::broker::log::stamps_below(connection, &below, PROBE)
        })?;
        for (source, c) in sources.iter().zip(checkpoints) {
            let Some(read) = stamps.get(&(source.topic.clone(), source.partition)) else {
                continue;
            };
            if let Some(r) = crate::checkpoint::recreated(c, read.iter().copied()) {
                return Err(Error::Recreated {
                    source_partition: source.to_string(),
                    message: crate::ingest::recreated_message(source, c, &r),
                });
            }
        }
        Ok(())
    }

    /// After librdkafka found a position outside its partition's log: which partitions, where
    /// the log is, and what to do; an error to stop on.
    pub(super) fn outside_the_log(&mut self, e: &rdkafka::error::KafkaError) -> Option<Error> {
        let mut out = Vec::new();
        let mut deleted: Vec<(String, i32, i64, i64)> = Vec::new();
        for ((topic, p), pos) in &self.positions {
            let at = pos.fetched.max(pos.landed);
            if at < 0 {
                continue;
            }
            let consumer = &self.consumer;
            let Ok((low, high)) = tokio::task::block_in_place(|| {
                consumer.fetch_watermarks(topic, *p, Duration::from_secs(10))
            }) else {
                continue;
            };
            if at < low {
                deleted.push((topic.clone(), *p, at, low));
                out.push(format!(
                    "{topic}/{p}: the pipeline resumes at offset {at} but the log starts at \
                     {low}: {} records were deleted (retention, or a delete) before they landed",
                    low - at
                ));
            } else if at > high {
                out.push(format!(
                    "{topic}/{p}: the pipeline resumes at offset {at} past the log's end {high}: \
                     was the topic deleted and created again? If so, move the partition to the \
                     new log: `streamtable reset-partition {topic} {p} --recreated`"
                ));
            }
        }
        if self.args.skip_deleted_records && !deleted.is_empty() && out.len() == deleted.len() {
            for (topic, p, at, low) in deleted {
                eprintln!(
                    "{topic}/{p}: {} records (offsets {at}..{low}) were deleted before they \
                     landed: going on from {low} (--skip-deleted-records)",
                    low - at
                );
                // The partition stopped in error: assigned again, at the log's start.
                let mut old = TopicPartitionList::new();
                old.add_partition(&topic, p);
                let mut new = TopicPartitionList::new();
                let again = new
                    .add_partition_offset(&topic, p, Offset::Offset(low))
                    .and_then(|()| self.consumer.incremental_unassign(&old))
                    .and_then(|()| self.consumer.incremental_assign(&new));
                if let Err(e) = again {
                    return Some(kafka_error(&format!("go on from {topic}/{p} {low}"), e));
                }
                if let Some(pos) = self.positions.get_mut(&(topic, p)) {
                    pos.fetched = low;
                }
            }
            return None;
        }
        if out.is_empty() {
            // A reset reported for a partition already moved (librdkafka reports each
            // partition's once, and they queue): nothing is outside its log now.
            tracing::warn!(error = %e, "an offset reset was reported; every position is inside its log");
            return None;
        }
        let what = out.join("; ");
        Some(Error::Config(format!(
            "{what}. Nothing was skipped: run stops rather than jump. Records deleted before \
             they landed are lost to the tables: --skip-deleted-records goes on from the log's \
             start. A topic created again under the same name needs a pipeline state of its \
             own (its checkpoints are by topic name and partition)"
        )))
    }
}
