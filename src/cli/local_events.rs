//! Partitions fed by local events, not by a Kafka cluster.
//!
//! On the embedded backend, `streamtable demo` and `streamtable ingest --event FILE` advance
//! checkpoints with events no cluster holds: their offsets count a log that exists nowhere. A
//! cluster's topic of the same name is another log. Were `streamtable run` to resume there, it
//! would skip the cluster's records below the demo's checkpoints (taken for already seen), or
//! stop past the log's end. So the home keeps a note (`local-events.json`) of the partitions
//! local events advanced, and `run` (and `demo --bootstrap-servers`) moves each such partition
//! to the cluster's log before it reads it, as `streamtable reset-partition --recreated` moves a
//! partition to a recreated topic's log: the checkpoint to the log's start, the window and
//! dedup state with it, the ledger of delivered offsets set aside (the audit leaves the local
//! rows out); the tables keep the rows. A partition a cluster fed once is never noted again: an
//! event file ingested later into it counts the cluster's offsets.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BackendConfig};
use crate::checkpoint::{Checkpoint, SourcePartition};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ingest::Ingestor;
use crate::spec::PipelineSpec;

/// The note's file name in the embedded home.
const FILE: &str = "local-events.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Notes {
    /// `topic/partition` of partitions local events advanced.
    #[serde(default)]
    local: BTreeSet<String>,
    /// `topic/partition` of partitions a cluster fed.
    #[serde(default)]
    cluster: BTreeSet<String>,
}

/// The home's note of which partitions local events fed.
#[derive(Debug)]
pub struct LocalEvents {
    path: PathBuf,
    notes: Notes,
}

fn key(source: &SourcePartition) -> String {
    format!("{}/{}", source.topic, source.partition)
}

impl LocalEvents {
    /// The note of the embedded home (none on the aws backend, where the demo runs on topics
    /// of its own and event files are the event source mapping's).
    pub fn open(config: &Config) -> Result<Option<LocalEvents>> {
        let BackendConfig::Embedded { home } = &config.backend else {
            return Ok(None);
        };
        let mut notes = LocalEvents {
            path: home.join(FILE),
            notes: Notes::default(),
        };
        notes.reload()?;
        Ok(Some(notes))
    }

    /// The note as the file holds it now (another command may have changed it since this
    /// one read it: each change reads, changes and writes the file).
    fn reload(&mut self) -> Result<()> {
        self.notes = match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::Config(format!(
                    "{}: not a note of local events ({e}); delete it if no partition of this \
                     home was fed by `streamtable demo` or `ingest --event`",
                    self.path.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Notes::default(),
            Err(e) => return Err(Error::io("read the note of local events", &self.path, e)),
        };
        Ok(())
    }

    fn save(&self) -> Result<()> {
        let json = serde_json::to_vec_pretty(&self.notes)
            .map_err(|e| Error::Internal(format!("the note of local events: {e}")))?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io("create the embedded home", dir, e))?;
        }
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, json)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| Error::io("write the note of local events", &self.path, e))
    }

    /// Notes `sources` (with their `checkpoints`) as fed by local events, before local events
    /// advance them: only a partition with no checkpoint yet, or one local events fed already.
    /// A partition with a checkpoint of unknown origin (a cluster's, in a home from before the
    /// note) is never taken for local, nor is one a cluster fed.
    pub fn note_local(
        &mut self,
        sources: &[SourcePartition],
        checkpoints: &[Checkpoint],
    ) -> Result<()> {
        self.reload()?;
        let before = self.notes.local.len();
        for (s, c) in sources.iter().zip(checkpoints) {
            let k = key(s);
            if c.version == 0 && !self.notes.cluster.contains(&k) {
                self.notes.local.insert(k);
            }
        }
        if self.notes.local.len() != before {
            self.save()?;
        }
        Ok(())
    }

    /// The partitions among `sources` a cluster fed (`topic/partition`).
    pub fn cluster_fed(&mut self, sources: &[SourcePartition]) -> Result<Vec<String>> {
        self.reload()?;
        Ok(sources
            .iter()
            .map(key)
            .filter(|k| self.notes.cluster.contains(k))
            .collect())
    }

    /// Whether local events fed `source` (and no cluster ever).
    pub fn is_local(&self, source: &SourcePartition) -> bool {
        let k = key(source);
        self.notes.local.contains(&k) && !self.notes.cluster.contains(&k)
    }

    /// The local partitions among `sources` with a checkpoint: what a cluster's run must move.
    pub fn to_move(
        &mut self,
        sources: &[SourcePartition],
        checkpoints: &[Checkpoint],
    ) -> Result<Vec<(SourcePartition, Checkpoint)>> {
        self.reload()?;
        Ok(sources
            .iter()
            .zip(checkpoints)
            .filter(|(s, c)| c.version > 0 && self.is_local(s))
            .map(|(s, c)| (s.clone(), *c))
            .collect())
    }

    /// Notes `sources` as fed by a cluster from now on.
    pub fn note_cluster<'a>(
        &mut self,
        sources: impl IntoIterator<Item = &'a SourcePartition>,
    ) -> Result<()> {
        self.reload()?;
        let mut changed = false;
        for s in sources {
            let k = key(s);
            changed |= self.notes.local.remove(&k);
            changed |= self.notes.cluster.insert(k);
        }
        if changed {
            self.save()?;
        }
        Ok(())
    }

    /// Moves each of `moves` (a partition local events fed, with its checkpoint) to the
    /// cluster's log, which starts at `start(topic, partition)`, and notes it as the cluster's;
    /// returns a line per partition moved. The batches of those partitions still pending are
    /// committed first (`land_pending`), as a reset needs.
    pub async fn move_to_cluster<F, L>(
        &mut self,
        backend: &Backend,
        spec: &PipelineSpec,
        moves: Vec<(SourcePartition, Checkpoint)>,
        mut start: F,
        land_pending: L,
    ) -> Result<Vec<String>>
    where
        F: FnMut(&str, i32) -> Result<i64>,
        L: AsyncFnOnce() -> Result<()>,
    {
        if moves.is_empty() {
            return Ok(Vec::new());
        }
        let pending = backend.state.pending().await?;
        if pending.iter().any(|b| {
            b.ranges()
                .any(|r| moves.iter().any(|(s, _)| r.source == *s))
        }) {
            land_pending().await?;
        }
        let ingestor = Ingestor::connect(spec, backend).await?;
        let mut lines = Vec::new();
        for (source, checkpoint) in moves {
            let Some(table) = spec.table_for_topic(&source.topic) else {
                continue;
            };
            let to = start(&source.topic, source.partition)?;
            let moved = super::move_to_new_log(
                backend,
                table,
                &ingestor,
                &source,
                checkpoint.next_offset,
                to,
            )
            .await?;
            if lines.is_empty() {
                lines.push(
                    "partitions fed by local events (`streamtable demo`, `ingest --event`) move \
                     to this cluster's logs: their checkpoints counted those events' offsets, \
                     not the cluster's (the tables keep the local rows; the audit leaves them \
                     out):"
                        .to_string(),
                );
            }
            lines.push(format!("  {}", moved.line()));
            self.note_cluster([&source])?;
        }
        Ok(lines)
    }
}

/// The latest Kafka timestamp (ms) the home's checkpoints of `topics` took, over partitions
/// `0..partitions`: where a generator's next run continues.
pub async fn newest_in_home(
    backend: &Backend,
    topics: &[String],
    partitions: i32,
) -> Result<Option<i64>> {
    let sources: Vec<SourcePartition> = topics
        .iter()
        .flat_map(|t| (0..partitions.max(1)).map(move |p| SourcePartition::new(t, p)))
        .collect();
    let checkpoints = backend.state.checkpoints(&sources).await?;
    Ok(checkpoints
        .iter()
        .map(|c| c.newest_ms)
        .filter(|ms| *ms >= 0)
        .max())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(dir: &std::path::Path) -> LocalEvents {
        let config = Config {
            pipeline: None,
            backend: BackendConfig::Embedded { home: dir.into() },
            topics: None,
        };
        LocalEvents::open(&config).expect("open").expect("embedded")
    }

    #[test]
    fn a_partition_a_cluster_fed_is_never_noted_local_again() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = (
            SourcePartition::new("orders", 0),
            SourcePartition::new("orders", 1),
        );
        let fresh = Checkpoint::INITIAL;
        let c = Checkpoint {
            next_offset: 5,
            version: 1,
            ..Checkpoint::INITIAL
        };
        let mut notes = events(dir.path());
        notes
            .note_local(&[a.clone(), b.clone()], &[fresh, fresh])
            .expect("note");
        assert!(events(dir.path()).is_local(&a), "kept in the home");
        notes.note_cluster([&a]).expect("note");
        notes
            .note_local(std::slice::from_ref(&a), &[fresh])
            .expect("note");
        let mut again = events(dir.path());
        assert!(!again.is_local(&a));
        assert!(again.is_local(&b));
        let moves = again
            .to_move(&[a.clone(), b.clone()], &[c, c])
            .expect("moves");
        assert_eq!(moves.len(), 1);
        assert_eq!(moves[0].0, b);
        // A partition without a checkpoint has nothing to move.
        assert!(
            again
                .to_move(std::slice::from_ref(&b), &[fresh])
                .expect("moves")
                .is_empty()
        );
        // A partition with a checkpoint of unknown origin (a cluster's, before the note) is
        // never taken for local: moving it would land its log twice.
        let d = SourcePartition::new("orders", 2);
        again
            .note_local(std::slice::from_ref(&d), &[c])
            .expect("note");
        assert!(!events(dir.path()).is_local(&d));
        // A note naming a partition both local and a cluster's: the cluster's.
        std::fs::write(
            dir.path().join(FILE),
            r#"{"local": ["orders/3"], "cluster": ["orders/3"]}"#,
        )
        .expect("write");
        let e = SourcePartition::new("orders", 3);
        assert!(
            events(dir.path())
                .to_move(&[e], &[c])
                .expect("moves")
                .is_empty()
        );
        // Another command's change is kept (each change reads the file first).
        let mut one = events(dir.path());
        let mut two = events(dir.path());
        let f = SourcePartition::new("orders", 4);
        one.note_local(std::slice::from_ref(&f), &[fresh])
            .expect("note");
        two.note_cluster([&SourcePartition::new("orders", 5)])
            .expect("note");
        assert!(events(dir.path()).is_local(&f));
    }

    #[test]
    fn a_damaged_note_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join(FILE), "not json").expect("write");
        let config = Config {
            pipeline: None,
            backend: BackendConfig::Embedded {
                home: dir.path().into(),
            },
            topics: None,
        };
        let err = LocalEvents::open(&config).expect_err("damaged");
        assert!(err.to_string().contains(FILE), "{err}");
    }
}
