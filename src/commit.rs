//! Commit: pending micro-files become Iceberg snapshots, exactly once.
//!
//! 1. Record a [`CommitIntent`] naming the pending batches to commit (or resume the one a
//!    crashed run left).
//! 2. Per table: if a snapshot anywhere in the table's history carries the commit id
//!    `{intent}/{table}` in its summary, that table is done; otherwise `fast_append` the files in
//!    one snapshot whose summary carries the commit id and the highest committed offset per
//!    topic-partition (`streamtable.offset.{topic}-{partition}`).
//! 3. Remove the batches and the intent.
//!
//! A crash between any two steps is finished by the next run without losing or repeating a
//! file: step 2 is skipped for tables whose commit id is in the history, and batches are only
//! removed once every table has its snapshot.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use iceberg::spec::{DataFile, deserialize_data_file_from_json};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use serde::Serialize;

use crate::checkpoint::{BatchKey, CommitIntent, PendingBatch, PendingFile};
use crate::config::Backend;
use crate::error::{Error, Result};
use crate::tables::TableSet;

/// Snapshot summary key carrying the commit id.
pub const COMMIT_ID_PROPERTY: &str = "streamtable.commit-id";
/// Prefix of the snapshot summary keys carrying committed offsets.
pub const OFFSET_PROPERTY_PREFIX: &str = "streamtable.offset.";
/// Most batches one commit covers (keeps the intent within a DynamoDB item).
pub const MAX_BATCHES_PER_COMMIT: usize = 2_000;

/// What a commit round did to one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableCommitReport {
    pub table: String,
    pub files: u64,
    pub rows: u64,
    /// The snapshot that holds the files.
    pub snapshot_id: Option<i64>,
    /// The snapshot already existed (a resumed commit).
    pub already_committed: bool,
}

/// What the commit stage did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CommitReport {
    /// Commit rounds run (each covers up to [`MAX_BATCHES_PER_COMMIT`] batches).
    pub rounds: u64,
    /// Pending batches committed and cleared.
    pub batches: u64,
    /// Rounds that finished an intent left by an earlier run.
    pub resumed: u64,
    pub tables: Vec<TableCommitReport>,
    pub duration_ms: f64,
}

impl CommitReport {
    pub fn files(&self) -> u64 {
        self.tables.iter().map(|t| t.files).sum()
    }

    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.rows).sum()
    }
}

/// Commits every pending batch.
pub async fn commit_pending(backend: &Backend, tables: &TableSet) -> Result<CommitReport> {
    let started = Instant::now();
    let mut report = CommitReport::default();
    loop {
        let (intent, resumed) = match backend.state.commit_intent().await? {
            Some(i) => (i, true),
            None => {
                let pending = backend.state.pending().await?;
                if pending.is_empty() {
                    break;
                }
                let intent = CommitIntent {
                    id: uuid::Uuid::new_v4().to_string(),
                    created_at_ms: now_ms(),
                    batches: pending
                        .iter()
                        .take(MAX_BATCHES_PER_COMMIT)
                        .map(PendingBatch::key)
                        .collect(),
                };
                if !backend.state.begin_commit(&intent).await? {
                    continue; // another committer got there first: resume its intent
                }
                (intent, false)
            }
        };
        tracing::info!(intent = %intent.id, batches = intent.batches.len(), resumed, "committing");
        let round = commit_intent(backend, tables, &intent).await?;
        backend.state.finish_commit(&intent).await?;
        report.rounds += 1;
        report.batches += intent.batches.len() as u64;
        report.resumed += u64::from(resumed);
        for t in round {
            match report.tables.iter_mut().find(|r| r.table == t.table) {
                Some(r) => {
                    r.files += t.files;
                    r.rows += t.rows;
                    r.snapshot_id = t.snapshot_id;
                    r.already_committed &= t.already_committed;
                }
                None => report.tables.push(t),
            }
        }
    }
    report.duration_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(report)
}

/// Commits the files of the intent's batches, table by table.
async fn commit_intent(
    backend: &Backend,
    tables: &TableSet,
    intent: &CommitIntent,
) -> Result<Vec<TableCommitReport>> {
    let wanted: HashSet<&BatchKey> = intent.batches.iter().collect();
    let batches: Vec<PendingBatch> = backend
        .state
        .pending()
        .await?
        .into_iter()
        .filter(|b| wanted.contains(&b.key()))
        .collect();
    // Files per table, and the highest offset per topic-partition feeding each table.
    let mut files: BTreeMap<String, Vec<PendingFile>> = BTreeMap::new();
    let mut offsets: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for b in &batches {
        for f in resolve_files(backend, b).await? {
            let o = offsets.entry(f.table.clone()).or_default();
            let e = o.entry(b.source.to_string()).or_insert(b.last_offset);
            *e = (*e).max(b.last_offset);
            files.entry(f.table.clone()).or_default().push(f);
        }
    }
    let mut out = Vec::new();
    for (table, files) in files {
        let id = format!("{}/{table}", intent.id);
        let props = offsets.remove(&table).unwrap_or_default();
        out.push(commit_table(backend, tables, &table, &id, &files, &props).await?);
    }
    Ok(out)
}

/// The batch's files, reading a spilled file list from the warehouse.
pub async fn resolve_files(backend: &Backend, batch: &PendingBatch) -> Result<Vec<PendingFile>> {
    let mut files = batch.files.clone();
    if let Some(location) = &batch.files_location {
        let bytes = backend.warehouse.read(location).await?;
        let spilled: Vec<PendingFile> =
            serde_json::from_slice(&bytes).map_err(|e| Error::State {
                op: "read pending files",
                message: format!("{location}: {e}"),
                retryable: false,
            })?;
        files.extend(spilled);
    }
    Ok(files)
}

/// Whether a snapshot in the table's history carries `commit_id`.
pub fn find_commit(table: &Table, commit_id: &str) -> Option<i64> {
    table
        .metadata()
        .snapshots()
        .find(|s| {
            s.summary()
                .additional_properties
                .get(COMMIT_ID_PROPERTY)
                .map(String::as_str)
                == Some(commit_id)
        })
        .map(|s| s.snapshot_id())
}

async fn commit_table(
    backend: &Backend,
    tables: &TableSet,
    name: &str,
    commit_id: &str,
    files: &[PendingFile],
    offsets: &BTreeMap<String, i64>,
) -> Result<TableCommitReport> {
    let mut report = TableCommitReport {
        table: name.to_string(),
        files: files.len() as u64,
        rows: files.iter().map(|f| f.rows).sum(),
        ..Default::default()
    };
    let table = tables.ensure(backend, name).await?;
    if let Some(id) = find_commit(&table, commit_id) {
        report.snapshot_id = Some(id);
        report.already_committed = true;
        return Ok(report);
    }
    let metadata = table.metadata();
    let spec = metadata.default_partition_spec();
    let partition_type = spec
        .partition_type(metadata.current_schema())
        .map_err(|e| Error::iceberg(format!("partition type of {name}"), e))?;
    let data_files = files
        .iter()
        .map(|f| {
            deserialize_data_file_from_json(
                &f.data_file,
                spec.spec_id(),
                &partition_type,
                metadata.current_schema(),
            )
            .map_err(|e| Error::iceberg(format!("pending data file of {name}"), e))
        })
        .collect::<Result<Vec<DataFile>>>()?;
    let mut props: HashMap<String, String> = offsets
        .iter()
        .map(|(source, offset)| {
            (
                format!("{OFFSET_PROPERTY_PREFIX}{source}"),
                offset.to_string(),
            )
        })
        .collect();
    props.insert(COMMIT_ID_PROPERTY.to_string(), commit_id.to_string());
    let tx = Transaction::new(&table);
    let append = tx
        .fast_append()
        .add_data_files(data_files)
        .set_snapshot_properties(props);
    let tx = append
        .apply(tx)
        .map_err(|e| Error::iceberg(format!("append to {name}"), e))?;
    let committed = tx
        .commit(&backend.catalog)
        .await
        .map_err(|e| Error::iceberg(format!("commit to {name}"), e))?;
    report.snapshot_id = find_commit(&committed, commit_id);
    tracing::info!(table = name, files = report.files, rows = report.rows, snapshot = ?report.snapshot_id, "committed");
    Ok(report)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
