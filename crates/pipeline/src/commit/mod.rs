//! Commit: pending micro-files become Iceberg snapshots, exactly once.
//!
//! 1. Record a [`CommitIntent`] naming the pending batches to commit (or resume the one a
//!    crashed run left). Batches are taken oldest first, and only those that can be committed
//!    ([`select`]): a batch that cannot (its table refuses the spec, its item is corrupt, a file
//!    lies outside its table) is reported as blocked and left pending, never in the way of the
//!    others.
//! 2. Per table: if a snapshot anywhere in the table's history carries the commit id
//!    `{intent}/{table}` in its summary, that table is done; otherwise `fast_append` the files in
//!    one snapshot whose summary carries the commit id and the highest committed offset per
//!    topic-partition (`streamtable.offset.{topic}-{partition}`).
//!    A topic's own table also gets, in the same metadata commit, its partitions' ledgers of
//!    delivered offsets with the round folded in (table properties
//!    `streamtable.ledger.{topic}-{partition}`, see [`crate::ledger`]), which `streamtable audit`
//!    reads: a snapshot with no files when the round landed none of its rows.
//! 3. Remove the batches and the intent.
//!
//! A crash between any two steps is finished by the next run without losing or repeating a
//! file: step 2 is skipped for tables whose commit id is in the history, and batches are only
//! removed once every table has its snapshot. A run makes at most
//! [`CommitOptions::max_rounds`] rounds and stops starting new ones at its deadline, so the
//! scheduled stage always reaches compaction and maintenance; what is left is reported as the
//! backlog.

pub mod audit;
mod carried;
#[cfg(feature = "sql")]
pub mod join;
#[cfg(feature = "sql")]
mod join_round;
pub mod landings;
pub mod lease;
pub mod ledger;
pub mod select;
pub mod trigger;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use serde::Serialize;

use crate::backend::Backend;
use crate::checkpoint::{PendingBatch, PendingFile};
use crate::error::{Error, Result};
use crate::store::CommitIntent;
use crate::table::lock::Turns;
use crate::table::{COMMIT_ID_PROPERTY, OFFSET_PROPERTY_PREFIX};
use crate::tables::TableSet;
pub use ledger::{RoundLedger, round_ledger};
pub use select::BlockedBatch;
use select::{Selector, TableFiles};

/// Default of [`CommitOptions::join_max_kept_rows`].
pub const DEFAULT_JOIN_MAX_KEPT_ROWS: usize = 1_000_000;

/// Default of [`CommitOptions::max_rounds`]: a run stops starting rounds at 40% of its time
/// anyway.
pub const DEFAULT_MAX_ROUNDS: u32 = 100;

/// Default of [`CommitOptions::max_round_bytes`].
pub const DEFAULT_MAX_ROUND_BYTES: u64 = 16 * 1024 * 1024;

/// Knobs of the commit stage. `Default` gives the documented defaults.
#[derive(Debug, Clone)]
pub struct CommitOptions {
    /// Most commit rounds in one run (each is one snapshot per table).
    pub max_rounds: u32,
    /// Most pending batches one round covers.
    pub max_batches_per_round: usize,
    /// Most bytes of batch keys one commit intent holds (a DynamoDB item holds 400 KB).
    pub max_intent_bytes: usize,
    /// Most bytes of files one round covers (at least one batch): what a round holds in
    /// memory (its audit, its carried rows) depends on this, never on the backlog.
    pub max_round_bytes: u64,
    /// Least time between two commits triggered by landed batches ([`trigger`]).
    pub min_interval: std::time::Duration,
    /// Most rows an interval join keeps per side between rounds; past it the oldest are
    /// forgotten (counted: `JoinRowsEvicted`).
    pub join_max_kept_rows: usize,
    /// Whether each round's files are read back and checked against what its batches were
    /// delivered ([`audit`]).
    pub audit_rounds: bool,
    /// Runs a round's units (each table's part, each interval join) in parallel.
    pub runner: crate::scheduled::runner::Runner,
}

impl Default for CommitOptions {
    fn default() -> Self {
        CommitOptions {
            max_rounds: DEFAULT_MAX_ROUNDS,
            max_batches_per_round: 2_000,
            max_intent_bytes: 300 * 1024,
            max_round_bytes: DEFAULT_MAX_ROUND_BYTES,
            min_interval: trigger::DEFAULT_INTERVAL,
            join_max_kept_rows: DEFAULT_JOIN_MAX_KEPT_ROWS,
            audit_rounds: true,
            runner: crate::scheduled::runner::Runner::per_core(),
        }
    }
}

/// What a commit round did to one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableCommitReport {
    /// The table.
    pub table: String,
    /// Files committed.
    pub files: u64,
    /// Rows committed.
    pub rows: u64,
    /// The snapshot that holds the files.
    pub snapshot_id: Option<i64>,
    /// The snapshot already existed (a resumed commit).
    pub already_committed: bool,
    /// For an interval join's table: what its round kept, forgot and deferred.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinStats>,
    /// For an upsert table: the rows the round made stale and its key count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upsert: Option<UpsertStats>,
}

/// What an upsert table's round did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UpsertStats {
    /// Keys whose live row a tombstone deleted.
    pub keys_deleted: u64,
    /// Rows deleted (older rows of the round's keys, and the round's own superseded rows).
    pub rows_deleted: u64,
    /// Position delete files written.
    pub delete_files: u64,
    /// Keys with a live row after the round.
    pub keys: u64,
    /// Data files read into the key index (after a compaction, or to build it).
    pub files_indexed: u64,
    /// Entries of the key index after the round (live keys and deleted keys it remembers).
    pub index_entries: u64,
    /// Bytes of the key index the round wrote (its changes, or a whole base).
    pub index_bytes: u64,
    /// Whether the round wrote the whole key index as a new base.
    pub index_base: bool,
    /// Whether the key index came from this process's memory (else read from storage).
    pub index_warm: bool,
}

/// What an interval join's round did with its state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JoinStats {
    /// Rows kept for the next round (both sides).
    pub kept_rows: u64,
    /// Bytes the round wrote for its state (its new rows' run, and a segment when it merged
    /// young runs).
    pub state_bytes: u64,
    /// Rows the round wrote for its state (about twice its new rows, amortized, while rows match for fewer than ~120 rounds).
    pub state_rows_written: u64,
    /// New rows the round read, both sides.
    pub new_rows: u64,
    /// Rows forgotten because a side kept more than `join_max_kept_rows`.
    pub evicted_rows: u64,
    /// New rows that came too late to be joined (behind their side's watermark), written as
    /// dead letters of kind `late`.
    pub late_rows: u64,
    /// Partitions that stopped holding their side's watermark (idle past `idle_timeout`).
    pub idle_partitions: u64,
    /// Files of the join's backlog that were gone when the round read them (their rows are
    /// not joined).
    pub backlog_files_lost: u64,
    /// The round could not run (it failed, or crashed before): its rows wait in the join's
    /// backlog for a later round, and the other tables went on.
    pub deferred: bool,
}

/// What is still pending when a run ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Backlog {
    /// Committable batches seen but left for the next run (a lower bound when `more`).
    pub batches: u64,
    /// More batches may be pending beyond those counted.
    pub more: bool,
    /// Age of the oldest batch left (committable or blocked), milliseconds.
    pub oldest_age_ms: Option<i64>,
}

/// What the commit stage did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CommitReport {
    /// Commit rounds run.
    pub rounds: u64,
    /// Pending batches committed and cleared.
    pub batches: u64,
    /// Rounds that finished an intent left by an earlier run.
    pub resumed: u64,
    /// Per table.
    pub tables: Vec<TableCommitReport>,
    /// Batches that cannot be committed, with the reason; they stay pending.
    pub blocked: Vec<BlockedBatch>,
    /// What is left for the next run.
    pub backlog: Backlog,
    /// Another committer held the commit lease until the deadline: nothing was committed.
    pub lease_busy: bool,
    /// Another committer took the lease over between rounds (this one had stalled past its
    /// end): the rounds stopped.
    pub lease_lost: bool,
    /// What the audits of the rounds found ([`audit`]).
    pub audit: audit::RoundAudit,
    /// Time the step took.
    pub duration_ms: f64,
}

impl CommitReport {
    /// Files committed, over all tables.
    pub fn files(&self) -> u64 {
        self.tables.iter().map(|t| t.files).sum()
    }

    /// Rows committed, over all tables.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.rows).sum()
    }

    fn add_round(&mut self, round: Vec<TableCommitReport>) {
        for t in round {
            match self.tables.iter_mut().find(|r| r.table == t.table) {
                Some(r) => {
                    r.files += t.files;
                    r.rows += t.rows;
                    r.snapshot_id = t.snapshot_id;
                    r.already_committed &= t.already_committed;
                    match (&mut r.join, t.join) {
                        (Some(a), Some(b)) => {
                            a.evicted_rows += b.evicted_rows;
                            a.backlog_files_lost += b.backlog_files_lost;
                            a.deferred |= b.deferred;
                            if !b.deferred {
                                a.kept_rows = b.kept_rows;
                                a.state_bytes = b.state_bytes;
                                a.state_rows_written = b.state_rows_written;
                                a.new_rows = b.new_rows;
                                a.idle_partitions = b.idle_partitions;
                            }
                        }
                        (a, b) => *a = a.take().or(b),
                    }
                }
                None => self.tables.push(t),
            }
        }
    }
}

/// Commits pending batches with the default options and no deadline.
pub async fn commit_pending(backend: &Backend, tables: &TableSet) -> Result<CommitReport> {
    commit_pending_with(backend, tables, &CommitOptions::default(), None).await
}

/// Commits pending batches, oldest first, in rounds, until none is left, `max_rounds` were
/// made or `deadline` passed — under the commit lease ([`lease`]), waited for until the
/// deadline (`lease_busy` when another committer held it all that time).
pub async fn commit_pending_with(
    backend: &Backend,
    tables: &TableSet,
    options: &CommitOptions,
    deadline: Option<Instant>,
) -> Result<CommitReport> {
    let until = deadline.unwrap_or_else(|| Instant::now() + crate::scheduled::DEFAULT_RUN_BUDGET);
    let Some(lease) = lease::Lease::acquire(backend, "commit", until).await? else {
        tracing::info!("another committer holds the commit lease; nothing committed by this one");
        return Ok(CommitReport {
            lease_busy: true,
            ..Default::default()
        });
    };
    let result = commit_rounds(backend, tables, options, deadline, &lease).await;
    lease.release(backend).await;
    result
}

/// [`commit_pending_with`]'s rounds, with the lease already held (renewed before each round).
pub(crate) async fn commit_rounds(
    backend: &Backend,
    tables: &TableSet,
    options: &CommitOptions,
    deadline: Option<Instant>,
    lease: &lease::Lease,
) -> Result<CommitReport> {
    let started = Instant::now();
    let now = backend.clock.now_ms();
    let mut report = CommitReport::default();
    let mut selector = Selector::new(backend, tables, options);
    let mut oldest_left = None;
    loop {
        let out_of_time = deadline.is_some_and(|d| Instant::now() >= d);
        if report.rounds >= u64::from(options.max_rounds) || out_of_time {
            // Counted as rounds used to be taken, by batch count alone: a round of the byte
            // bound would say how much fits one round, not how much is left.
            let left = selector.left(now).await?;
            report.backlog.batches = left.batches.len() as u64;
            report.backlog.more = left.more;
            oldest_left = left.batches.iter().map(|b| b.created_at_ms).min();
            break;
        }
        if !lease.renew(backend).await? {
            tracing::warn!(
                holder = lease.holder(),
                "the commit lease was taken over; stopping before the next round"
            );
            report.lease_lost = true;
            break;
        }
        let mut landed = Vec::new();
        let (intent, resumed) = match backend.state.commit_intent().await? {
            Some(i) => (i, true),
            None => {
                let round = selector.next_round(now).await?;
                if round.batches.is_empty() {
                    break;
                }
                let intent = CommitIntent {
                    id: uuid::Uuid::new_v4().to_string(),
                    created_at_ms: backend.clock.now_ms(),
                    batches: round.batches.iter().map(PendingBatch::key).collect(),
                };
                if !backend.state.begin_commit(&intent).await? {
                    continue; // another committer got there first: resume its intent
                }
                landed = round.batches;
                (intent, false)
            }
        };
        tracing::info!(intent = %intent.id, batches = intent.batches.len(), resumed, "committing");
        let (round, batches, by_table) =
            commit_intent(backend, tables, &mut selector, &intent).await?;
        backend.state.finish_commit(&intent).await?;
        // After the round is done, so that a run cut short while reading never holds it up;
        // not past the deadline (counted as skipped).
        let out_of_time = deadline.is_some_and(|d| Instant::now() >= d);
        if options.audit_rounds && out_of_time {
            report.audit.skipped_rounds += 1;
        } else if options.audit_rounds {
            let audited = audit::audit_round(tables, &mut selector, &batches, &by_table).await;
            if !audited.ok() {
                tracing::error!(intent = %intent.id, missing = audited.missing, duplicated = audited.duplicated,
                    unexpected = audited.unexpected, findings = ?audited.findings,
                    "the round's files do not hold what its batches were delivered exactly once; `streamtable audit` names the offsets");
            }
            report.audit.add(audited);
        }
        landings::record_committed(backend, &landed).await;
        selector.forget_round();
        report.rounds += 1;
        report.batches += intent.batches.len() as u64;
        report.resumed += u64::from(resumed);
        report.add_round(round);
    }
    report.blocked = selector.blocked();
    let oldest = match (oldest_left, selector.oldest_left_ms()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    report.backlog.oldest_age_ms = oldest.map(|at| (backend.clock.now_ms() - at).max(0));
    report.duration_ms = started.elapsed().as_secs_f64() * 1e3;
    if !report.blocked.is_empty() {
        tracing::error!(blocked = report.blocked.len(), first = %report.blocked[0],
            "pending batches cannot be committed; they stay pending until the cause is fixed");
    }
    Ok(report)
}

/// Commits the files of the intent's batches, table by table.
async fn commit_intent(
    backend: &Backend,
    tables: &TableSet,
    selector: &mut Selector<'_>,
    intent: &CommitIntent,
) -> Result<(Vec<TableCommitReport>, Vec<PendingBatch>, RoundFiles)> {
    let page = backend.state.batches(&intent.batches).await?;
    if let Some((key, why)) = page.unreadable.first() {
        return Err(Error::State {
            op: "resume commit",
            message: format!(
                "batch {} of commit {} cannot be read: {why}",
                key.sort_key(),
                intent.id
            ),
            retryable: false,
        });
    }
    let mut by_table: BTreeMap<String, TableFiles> = BTreeMap::new();
    for b in &page.batches {
        let resolved = match selector.resolve(b).await {
            Ok(r) => r,
            Err(select::Blocked::Transient(e)) => return Err(e),
            Err(refused) => {
                return Err(Error::State {
                    op: "resume commit",
                    message: format!(
                        "batch {} of commit {} cannot be committed: {refused}",
                        b.key().sort_key(),
                        intent.id
                    ),
                    retryable: false,
                });
            }
        };
        for (table, files) in resolved {
            let entry = by_table.entry(table).or_default();
            // An idle partition's flush has no offsets (its key is the negated state seq).
            for r in b.ranges().filter(|r| r.last_offset >= 0) {
                let offset = entry
                    .offsets
                    .entry(r.source.to_string())
                    .or_insert(r.last_offset);
                *offset = (*offset).max(r.last_offset);
            }
            entry.files.extend(files.files);
            entry.data_files.extend(files.data_files);
            entry.carried.extend(files.carried);
            entry.key_deletes.extend(files.key_deletes);
        }
    }
    ledger::assign(tables, selector, &page.batches, &mut by_table).await?;
    let by_table: RoundFiles = by_table
        .into_iter()
        .map(|(name, files)| (name, Arc::new(files)))
        .collect();
    // The round's units: each table's part, each interval join with rows in the round. The
    // coordinator (this selector) loads their tables; the units run in parallel.
    let mut units = Vec::new();
    for (name, files) in &by_table {
        let table = selector.table(name).await?;
        units.push(RoundUnit::Table {
            name: name.clone(),
            table: Box::new(table),
            files: files.clone(),
        });
    }
    #[cfg(feature = "sql")]
    units.extend(join_round::join_units(tables, selector, &by_table).await?);
    let context = UnitContext {
        backend: backend.clone(),
        tables: Arc::new(tables.clone()),
        intent: intent.clone(),
        #[cfg(feature = "sql")]
        join_max_kept_rows: selector.options().join_max_kept_rows,
        turns: Turns::default(),
    };
    let results = selector
        .options()
        .runner
        .run(units, |unit| {
            let context = context.clone();
            async move { unit.run(&context).await }
        })
        .await;
    let mut out = Vec::new();
    let mut first_error = None;
    for result in results {
        match result {
            Ok(Ok(reports)) => out.extend(reports),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(panic) => {
                first_error.get_or_insert(Error::Internal(panic.to_string()));
            }
        }
    }
    // One unit failed: the intent stays, and the next attempt resumes it (the tables that
    // landed their part are found by their commit ids).
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok((out, page.batches, by_table))
}

/// A round's files, by table.
type RoundFiles = BTreeMap<String, Arc<TableFiles>>;

/// What every unit of a round shares (cheap to clone).
#[derive(Clone)]
struct UnitContext {
    backend: Backend,
    tables: Arc<TableSet>,
    intent: CommitIntent,
    #[cfg(feature = "sql")]
    join_max_kept_rows: usize,
    /// Units that commit to one table take turns.
    turns: Turns,
}

/// A unit of work of a commit round.
enum RoundUnit {
    /// A table's part: its files appended (or upserted) under the commit id
    /// `{intent}/{table}`.
    Table {
        name: String,
        table: Box<Table>,
        files: Arc<TableFiles>,
    },
    /// An interval join's round over the sides' files.
    #[cfg(feature = "sql")]
    Join(Box<join_round::JoinUnit>),
}

impl RoundUnit {
    async fn run(self, c: &UnitContext) -> Result<Vec<TableCommitReport>> {
        match self {
            RoundUnit::Table { name, table, files } => {
                let id = format!("{}/{name}", c.intent.id);
                Ok(vec![
                    commit_table(&c.backend, &c.tables, &c.turns, *table, &name, &id, &files)
                        .await?,
                ])
            }
            #[cfg(feature = "sql")]
            RoundUnit::Join(j) => join_round::commit_join(c, *j).await,
        }
    }
}

/// Whether a snapshot in the table's history carries `commit_id`.
pub fn find_commit(table: &Table, commit_id: &str) -> Option<i64> {
    crate::table::replace::snapshot_with(table, COMMIT_ID_PROPERTY, commit_id)
}

async fn commit_table(
    backend: &Backend,
    tables: &TableSet,
    turns: &Turns,
    table: Table,
    name: &str,
    commit_id: &str,
    files: &TableFiles,
) -> Result<TableCommitReport> {
    let mut report = TableCommitReport {
        table: name.to_string(),
        files: files.files.len() as u64,
        rows: files
            .files
            .iter()
            .filter(|f: &&PendingFile| f.key_deletes.is_none())
            .map(|f| f.rows)
            .sum(),
        ..Default::default()
    };
    // The round's units that commit to one table take turns (the join's late rows and the
    // round's own dead letters).
    let _turn = turns.take(name).await;
    let table = match backend.catalog.load(&tables.ident(name)).await? {
        Some((t, _)) => t,
        None => table,
    };
    if let Some(id) = find_commit(&table, commit_id) {
        report.snapshot_id = Some(id);
        report.already_committed = true;
        return Ok(report);
    }
    let mut props: HashMap<String, String> = files
        .offsets
        .iter()
        .map(|(source, offset)| {
            (
                format!("{OFFSET_PROPERTY_PREFIX}{source}"),
                offset.to_string(),
            )
        })
        .collect();
    props.insert(COMMIT_ID_PROPERTY.to_string(), commit_id.to_string());
    props.extend(files.properties.clone());
    let mut data_files = files.data_files.to_vec();
    if !files.carried.is_empty() {
        let layout = tables.catalog_layout(name, &table)?;
        let location = table
            .metadata()
            .location()
            .trim_end_matches('/')
            .to_string();
        let intent = commit_id.split('/').next().unwrap_or(commit_id);
        data_files
            .extend(carried::write(backend, &layout, &location, intent, &files.carried).await?);
    }
    let upsert = tables
        .tables
        .get(name)
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.upsert.as_ref());
    if let Some(upsert) = upsert {
        let topic = tables
            .topic_tables
            .iter()
            .find(|(_, t)| t.as_str() == name)
            .map(|(topic, _)| topic.as_str());
        let done = crate::upsert::commit_upsert(
            &backend.catalog,
            &tables.ident(name),
            &upsert.key,
            &data_files,
            &files.key_deletes,
            &props,
            &|t: &iceberg::table::Table, tombstones: &BTreeMap<i32, u64>| {
                let mut props = ledger::folded(t, name, &files.ledger);
                // A topic's own upsert table counts its tombstones for the audit.
                if let Some(topic) = topic {
                    props.extend(ledger::counted(t, topic, tombstones, |c, n| {
                        c.tombstones = c.tombstones.saturating_add(n)
                    }));
                }
                props
            },
        )
        .await?;
        report.snapshot_id = done.snapshot_id;
        report.already_committed = done.already_committed;
        report.upsert = Some(UpsertStats {
            keys_deleted: done.keys_deleted,
            rows_deleted: done.rows_deleted,
            delete_files: done.delete_files,
            keys: done.keys,
            files_indexed: done.files_indexed,
            index_entries: done.index_entries,
            index_bytes: done.index_bytes,
            index_base: done.index_base,
            index_warm: done.index_warm,
        });
        return Ok(report);
    }
    let ledgers = ledger::folded(&table, name, &files.ledger);
    let tx = Transaction::new(&table);
    let append = tx
        .fast_append()
        .add_data_files(data_files)
        .set_snapshot_properties(props);
    let mut tx = append
        .apply(tx)
        .map_err(|e| Error::iceberg(format!("append to {name}"), e))?;
    // In the same metadata commit: the ledger moves with the rows, or not at all.
    if !ledgers.is_empty() {
        let update = ledgers
            .into_iter()
            .fold(tx.update_table_properties(), |a, (k, v)| a.set(k, v));
        tx = update
            .apply(tx)
            .map_err(|e| Error::iceberg(format!("record the ledger of {name}"), e))?;
    }
    let committed = match tx.commit(&backend.catalog).await {
        Ok(t) => t,
        Err(e) => {
            // The append may have landed with its answer lost (and a retry then refused as a
            // duplicate): the commit id in the history says so.
            let reloaded = backend.catalog.load(&tables.ident(name)).await?;
            match reloaded.map(|(t, _)| t) {
                Some(t) if find_commit(&t, commit_id).is_some() => {
                    tracing::warn!(table = name, error = %e, "the append reported an error, but its snapshot is in the table");
                    t
                }
                _ => return Err(Error::iceberg(format!("commit to {name}"), e)),
            }
        }
    };
    report.snapshot_id = find_commit(&committed, commit_id);
    tracing::info!(table = name, files = report.files, rows = report.rows, snapshot = ?report.snapshot_id, "committed");
    Ok(report)
}
