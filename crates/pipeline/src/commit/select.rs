//! Which pending batches a commit round takes: the oldest ones that can be committed.
//!
//! A batch can be committed when its item is readable, its spilled file list (if any) is
//! readable, and every file it names belongs to a table of the pipeline spec that the catalog
//! accepts (schema and partitioning as the spec says), was written for that table's
//! partitioning, and lies in that table's `data/` directory. A batch that fails one of these is
//! *blocked*: reported with the reason, left pending, and skipped, so one bad batch or one
//! refused table never holds back the others. A transient fault (S3, DynamoDB, Glue) is not a
//! reason to block: it fails the round, and the next run tries again.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use bytes::Bytes;

use iceberg::spec::{DataFile, deserialize_data_file_from_json};
use iceberg::table::Table;
use serde::Serialize;

use super::CommitOptions;
use crate::backend::Backend;
use crate::checkpoint::{BatchKey, CarriedRows, PendingBatch, PendingFile};
use crate::error::{Error, Result};
use crate::schema::describe_partitioning;
use crate::tables::TableSet;

/// A pending batch that cannot be committed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct BlockedBatch {
    /// The batch: `{topic}-{partition}@{first offset}`.
    pub batch: String,
    /// The table it is blocked on, when one is to blame.
    pub table: Option<String>,
    /// What is wrong and how to fix it.
    pub reason: String,
    /// When the batch was recorded, epoch milliseconds.
    pub created_at_ms: i64,
}

impl fmt::Display for BlockedBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.table {
            Some(t) => write!(f, "batch {} (table {t}): {}", self.batch, self.reason),
            None => write!(f, "batch {}: {}", self.batch, self.reason),
        }
    }
}

/// The files of one table a round commits.
#[derive(Debug, Default)]
pub(super) struct TableFiles {
    pub files: Vec<PendingFile>,
    pub data_files: Vec<DataFile>,
    /// Rows carried in state files, in the table's current schema: the commit writes them
    /// into the table ([`super::carried`]).
    pub carried: Vec<RecordBatch>,
    /// Files of keys to delete (an upsert table's tombstones): location and size.
    pub key_deletes: Vec<(String, u64)>,
    /// Highest offset per topic-partition.
    pub offsets: BTreeMap<String, i64>,
    /// More snapshot summary properties (a join's state).
    pub properties: BTreeMap<String, String>,
    /// For a topic's own table: the round's part of its partitions' ledgers, by
    /// `topic-partition`.
    pub ledger: Vec<(String, super::RoundLedger)>,
}

impl TableFiles {
    /// Whether the round lands nothing in the table (only its ledger, if anything).
    pub fn lands_nothing(&self) -> bool {
        self.files.is_empty()
            && self.data_files.is_empty()
            && self.carried.is_empty()
            && self.key_deletes.is_empty()
    }
}

/// The batches of one round.
pub(super) struct Round {
    pub batches: Vec<PendingBatch>,
    /// More committable batches may be pending.
    pub more: bool,
}

/// Why a batch is blocked, and on which table.
type Refusal = (Option<String>, String);

/// Picks rounds of batches, remembering for the run which tables and batches are refused.
pub(super) struct Selector<'a> {
    backend: &'a Backend,
    tables: &'a TableSet,
    options: &'a CommitOptions,
    table_status: HashMap<String, std::result::Result<Table, String>>,
    blocked: BTreeMap<String, BlockedBatch>,
    /// The rows each state file read this run carries, by part.
    carried: HashMap<String, std::result::Result<Arc<Vec<Bytes>>, String>>,
    /// Parts decoded this run, by (state file, part, table): a round resolves its batches
    /// twice (to pick them, then to commit them).
    decoded: HashMap<(String, u32, String), RecordBatch>,
}

impl<'a> Selector<'a> {
    /// The commit stage's options.
    pub fn options(&self) -> &'a CommitOptions {
        self.options
    }

    pub fn new(backend: &'a Backend, tables: &'a TableSet, options: &'a CommitOptions) -> Self {
        Selector {
            backend,
            tables,
            options,
            table_status: HashMap::new(),
            blocked: BTreeMap::new(),
            carried: HashMap::new(),
            decoded: HashMap::new(),
        }
    }

    /// The blocked batches seen so far, oldest first.
    pub fn blocked(&self) -> Vec<BlockedBatch> {
        self.blocked.values().cloned().collect()
    }

    /// When the oldest blocked batch was recorded.
    pub fn oldest_left_ms(&self) -> Option<i64> {
        self.blocked.values().map(|b| b.created_at_ms).min()
    }

    fn block(&mut self, key: &BatchKey, (table, reason): Refusal) {
        let batch = format!("{}@{}", key.source, key.first_offset);
        tracing::warn!(batch = %batch, table = ?table, reason = %reason, "pending batch blocked");
        self.blocked.insert(
            key.sort_key(),
            BlockedBatch {
                batch,
                table,
                reason,
                created_at_ms: key.created_at_ms,
            },
        );
    }

    /// The oldest committable batches, within the round's limits.
    pub async fn next_round(&mut self, now_ms: i64) -> Result<Round> {
        self.take(now_ms, self.options.max_round_bytes).await
    }

    /// The committable batches left (at most a round's count of them, `more` past it),
    /// whatever their bytes: the backlog a run leaves.
    pub async fn left(&mut self, now_ms: i64) -> Result<Round> {
        let left = self.take(now_ms, u64::MAX).await;
        self.forget_round();
        left
    }

    async fn take(&mut self, _now_ms: i64, max_bytes: u64) -> Result<Round> {
        let per_round = self.options.max_batches_per_round.max(1);
        let mut chosen: Vec<PendingBatch> = Vec::new();
        let mut bytes = 0usize;
        let mut file_bytes = 0u64;
        let mut after: Option<String> = None;
        loop {
            let page = self
                .backend
                .state
                .pending_page(after.as_deref(), per_round)
                .await?;
            for (key, why) in &page.unreadable {
                self.block(key, (None, format!("pending item cannot be read: {why}")));
            }
            for b in page.batches {
                let key = b.key();
                if self.blocked.contains_key(&key.sort_key()) {
                    continue;
                }
                match self.resolve(&b).await {
                    Ok(resolved) => {
                        let size = serde_json::to_vec(&key).map_or(256, |v| v.len() + 1);
                        // Its files as resolved: a long file list is spilled out of the item.
                        let batch_bytes: u64 = resolved
                            .values()
                            .flat_map(|t| &t.files)
                            .map(|f| f.bytes)
                            .sum();
                        let full = chosen.len() >= per_round
                            || bytes + size > self.options.max_intent_bytes
                            || (!chosen.is_empty()
                                && file_bytes.saturating_add(batch_bytes) > max_bytes);
                        if full {
                            return Ok(Round {
                                batches: chosen,
                                more: true,
                            });
                        }
                        bytes += size;
                        file_bytes = file_bytes.saturating_add(batch_bytes);
                        chosen.push(b);
                    }
                    Err(Blocked::Refused(refusal)) => self.block(&key, refusal),
                    Err(Blocked::Transient(e)) => return Err(e),
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => {
                    return Ok(Round {
                        batches: chosen,
                        more: false,
                    });
                }
            }
        }
    }

    /// Forgets the state files read and the rows decoded for a finished round: what the
    /// selector holds is one round's, never the run's (a state file shared by the batches of
    /// two rounds is read again by the second).
    pub fn forget_round(&mut self) {
        self.carried.clear();
        self.decoded.clear();
    }

    /// The table, created from the spec if absent, checked against it; refused tables are
    /// remembered for the run.
    pub(super) async fn table_status(
        &mut self,
        name: &str,
    ) -> Result<std::result::Result<Table, String>> {
        if let Some(status) = self.table_status.get(name) {
            return Ok(status.clone());
        }
        let status = if self.tables.tables.contains_key(name) {
            match self.tables.ensure(self.backend, name).await {
                Ok(t) => match self.key_refusal(name, &t).await {
                    Ok(None) => Ok(t),
                    Ok(Some(why)) => Err(why),
                    Err(e) if e.is_retryable() => return Err(e),
                    Err(e) => Err(e.to_string()),
                },
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) => Err(e.to_string()),
            }
        } else {
            Err(format!(
                "table {name:?} has pending files but is not in the pipeline spec; restore its [[tables]] entry"
            ))
        };
        if let Err(why) = &status {
            tracing::error!(table = name, reason = %why, "table refused; its batches stay pending");
        }
        self.table_status.insert(name.to_string(), status.clone());
        Ok(status)
    }

    /// Why upsert table `name` (`table`) cannot take the spec's key, if so: its rows are kept by
    /// another key (or by none) and the spec does not acknowledge the re-key.
    async fn key_refusal(&self, name: &str, table: &Table) -> Result<Option<String>> {
        let Some(upsert) = self
            .tables
            .tables
            .get(name)
            .and_then(|d| d.spec.as_ref())
            .and_then(|s| s.upsert.as_ref())
        else {
            return Ok(None);
        };
        let recorded = crate::upsert::recorded_key(table).await?;
        Ok(match upsert.key_change(name, &recorded) {
            crate::spec::KeyChange::Same => None,
            crate::spec::KeyChange::Rekey { from } => {
                tracing::warn!(table = name, from = ?from, to = ?upsert.key,
                    "re-keying the table's current rows (rekey_from): one row per new key is kept");
                None
            }
            crate::spec::KeyChange::Refused(why) => Some(why),
        })
    }

    /// The backend the run commits to.
    pub(super) fn backend(&self) -> &'a Backend {
        self.backend
    }

    /// The table (as checked for this run), or the reason it is refused.
    pub async fn table(&mut self, name: &str) -> Result<Table> {
        self.table_status(name)
            .await?
            .map_err(|why| Error::Config(format!("table {name}: {why}")))
    }

    /// The batch's files per table, each checked and parsed; or why the batch is blocked.
    pub async fn resolve(
        &mut self,
        batch: &PendingBatch,
    ) -> std::result::Result<BTreeMap<String, TableFiles>, Blocked> {
        let files = match crate::table::pending::resolve_files(self.backend, batch).await {
            Ok(f) => f,
            Err(e) if e.is_retryable() => return Err(Blocked::Transient(e)),
            Err(e) => return Err(Blocked::Refused((None, e.to_string()))),
        };
        let mut out: BTreeMap<String, TableFiles> = BTreeMap::new();
        for f in files {
            let table = match self.table_status(&f.table).await {
                Ok(Ok(t)) => t,
                Ok(Err(why)) => return Err(Blocked::Refused((Some(f.table.clone()), why))),
                Err(e) => return Err(Blocked::Transient(e)),
            };
            let refused = |why| Blocked::Refused((Some(f.table.clone()), why));
            if let Some(k) = &f.key_deletes {
                let upsert = self
                    .tables
                    .tables
                    .get(&f.table)
                    .and_then(|d| d.spec.as_ref())
                    .is_some_and(|s| s.upsert.is_some());
                if !upsert {
                    return Err(refused(format!(
                        "the batch deletes keys (tombstones) from {}, which is not mode = \"upsert\" in the spec; set it back until these batches are committed",
                        f.table
                    )));
                }
                let data_dir = format!(
                    "{}/data/",
                    table.metadata().location().trim_end_matches('/')
                );
                if !k.file.starts_with(&data_dir) || k.file.split('/').any(|p| p == "..") {
                    return Err(refused(format!(
                        "its key delete file {} lies outside the table's data directory {data_dir}; refusing to read it",
                        k.file
                    )));
                }
                let entry = out.entry(f.table.clone()).or_default();
                entry.key_deletes.push((k.file.clone(), f.bytes));
                entry.files.push(f);
                continue;
            }
            check_partitioning(&table, &f).map_err(refused)?;
            if let Some(c) = &f.carried {
                let rows = self.carried_rows(c, &f, &table).await?;
                let entry = out.entry(f.table.clone()).or_default();
                entry.carried.push(rows);
                entry.files.push(f);
                continue;
            }
            let data_file = check_file(&table, &f).map_err(refused)?;
            let entry = out.entry(f.table.clone()).or_default();
            entry.data_files.push(data_file);
            entry.files.push(f);
        }
        Ok(out)
    }

    /// The rows `f` has carried in a state file, in `table`'s current schema: the part it
    /// names, checked to be a Parquet file of `f.rows` rows of the table in one of the
    /// warehouse's state files. A state file that is gone or damaged blocks the batch (its rows
    /// are nowhere else), naming the file.
    async fn carried_rows(
        &mut self,
        c: &CarriedRows,
        f: &PendingFile,
        table: &Table,
    ) -> std::result::Result<RecordBatch, Blocked> {
        let refused = |why: String| Blocked::Refused((Some(f.table.clone()), why));
        let at = (c.file.clone(), c.part, f.table.clone());
        if let Some(rows) = self.decoded.get(&at)
            && rows.num_rows() as u64 == f.rows
        {
            return Ok(rows.clone());
        }
        let states = format!(
            "{}/_state/partitions/",
            self.backend.warehouse.root().trim_end_matches('/')
        );
        if !c.file.starts_with(&states)
            || !c.file.ends_with(".run")
            || c.file.split('/').any(|part| part == "..")
        {
            return Err(refused(format!(
                "its rows are carried in {}, which is not a state file under {states}; refusing to read it",
                c.file
            )));
        }
        if !self.carried.contains_key(&c.file) {
            let parts = match self.backend.warehouse.read(&c.file).await {
                Ok(bytes) => crate::process::partition_state::decode_rows(&bytes, &c.file)
                    .map(Arc::new)
                    .map_err(|e| e.to_string()),
                Err(e) if e.is_retryable() => return Err(Blocked::Transient(e)),
                Err(e) => Err(format!(
                    "the state file carrying its rows cannot be read: {e}"
                )),
            };
            self.carried.insert(c.file.clone(), parts);
        }
        let parts = match &self.carried[&c.file] {
            Ok(parts) => parts,
            Err(why) => return Err(refused(why.clone())),
        };
        let part = parts.get(c.part as usize).ok_or_else(|| {
            refused(format!(
                "state file {} carries {} parts of rows, not part {}",
                c.file,
                parts.len(),
                c.part
            ))
        })?;
        let layout = self
            .tables
            .catalog_layout(&f.table, table)
            .map_err(|e| refused(e.to_string()))?;
        let what = format!("part {} of state file {}", c.part, c.file);
        let rows = super::carried::decode(part, &layout.arrow_schema, f.rows)
            .map_err(|e| refused(format!("{what}: {e}")))?;
        if rows.num_rows() as u64 != f.rows {
            return Err(refused(format!(
                "{what} holds {} rows, not the {} its batch recorded",
                rows.num_rows(),
                f.rows
            )));
        }
        self.decoded.insert(at, rows.clone());
        Ok(rows)
    }
}

/// Why [`Selector::resolve`] did not resolve a batch.
pub(super) enum Blocked {
    /// The batch cannot be committed as it is.
    Refused(Refusal),
    /// A transient fault: try again later.
    Transient(Error),
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocked::Refused((_, why)) => f.write_str(why),
            Blocked::Transient(e) => write!(f, "{e}"),
        }
    }
}

/// Refuses a pending file written for another partitioning than `table`'s.
fn check_partitioning(table: &Table, f: &PendingFile) -> std::result::Result<(), String> {
    let metadata = table.metadata();
    let have = describe_partitioning(metadata.default_partition_spec(), metadata.current_schema());
    match &f.partitioning {
        Some(written) if written != &have => Err(format!(
            "a file was written for partition_by = {written:?} but the table is partitioned by {have:?}; \
             set partition_by back to {written:?} until these batches are committed"
        )),
        _ => Ok(()),
    }
}

/// Parses a pending file for `table`, refusing one lying outside the table's `data/`
/// directory (a forged or corrupt item could otherwise register any object as table data).
fn check_file(table: &Table, f: &PendingFile) -> std::result::Result<DataFile, String> {
    let metadata = table.metadata();
    let spec = metadata.default_partition_spec();
    let schema = metadata.current_schema();
    let partition_type = spec
        .partition_type(schema)
        .map_err(|e| format!("partition type: {e}"))?;
    let data_file =
        deserialize_data_file_from_json(&f.data_file, spec.spec_id(), &partition_type, schema)
            .map_err(|e| format!("pending data file cannot be read: {e}"))?;
    let data_dir = format!("{}/data/", metadata.location().trim_end_matches('/'));
    let path = data_file.file_path();
    if !path.starts_with(&data_dir) || path.split('/').any(|part| part == "..") {
        return Err(format!(
            "file {path} lies outside the table's data directory {data_dir}; refusing to register it"
        ));
    }
    Ok(data_file)
}
