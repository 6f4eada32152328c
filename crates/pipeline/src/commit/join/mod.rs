//! Interval joins between two topics, run by the commit stage over the rows each round lands.
//!
//! The two topics arrive through different event source mappings, so no ingest invocation sees
//! both; the commit stage is a single writer (one intent at a time) that does. Each round:
//!
//! 1. reads the join's state — the rows of each side that can still match, and the highest
//!    event time per topic-partition — from the object the join table's current snapshot names
//!    (summary key [`JOIN_STATE_PROPERTY`]);
//! 2. reads the round's new rows of both sides from the intent's data files; a new row behind
//!    its side's watermark (the lowest of its partitions' highest event times, minus the
//!    table's out-of-orderness) may have missed a partner that was already forgotten: it is a
//!    dead letter of kind `late` (it stays in its own table);
//! 3. runs the join's SQL over kept + new rows, keeping pairs with at least one new row: each
//!    pair is produced once, by the round in which its second row arrives;
//! 4. forgets the rows that can no longer match — a left row once the right side's watermark
//!    passed its time plus the upper bound, a right row once the left side's passed its time
//!    minus the lower bound — and writes the rest as the next state object (named by intent);
//! 5. commits the late rows to `dead_letters` (commit id `{intent}/{table}/late`), then the
//!    joined rows to the join table in one snapshot whose summary names the new state.
//!
//! Everything a round computes is a function of the intent's files and the state the current
//! snapshot names, so a crashed round recomputes the same rows; the join table's commit id
//! says whether the round landed, and the state moves with that same snapshot.

mod backlog;
mod rows;
mod runs;

use std::collections::BTreeMap;

use arrow_array::{Array, Int32Array, RecordBatch};
use datafusion::arrow::compute::{concat_batches, filter_record_batch};
use datafusion::prelude::SessionContext;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use serde::{Deserialize, Serialize};

use super::select::TableFiles;
use crate::backend::Backend;
use crate::decode::DeadLetterBuilder;
use crate::error::{Error, Result};
use crate::schema::TableLayout;
use crate::spec::{DEAD_LETTER_TABLE, IntervalJoin, JoinSide};
use crate::tables::TableSet;
use backlog::Backlog;
use rows::{
    add_files, arrow, column, conform, dead_letters, keep_mask, late_mask, not, register, side,
    with_kafka_columns,
};
use runs::{KeptRun, next_runs, own_objects};

pub use crate::table::JOIN_STATE_PROPERTY;

/// What a join keeps between rounds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct JoinState {
    /// Parquet object with all of the left side's rows that can still match, as releases
    /// before runs wrote it (read as the oldest run, replaced by the next round).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    left: Option<String>,
    /// The same for the right side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    right: Option<String>,
    /// The left side's rows that can still match, as runs (immutable Parquet objects), oldest
    /// first: each round adds one of its new rows; a run none of whose rows can match any more
    /// is dropped whole, unread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    left_runs: Vec<KeptRun>,
    /// The same for the right side.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    right_runs: Vec<KeptRun>,
    /// Highest event time per `{table}/{partition}`, µs.
    #[serde(default)]
    max: BTreeMap<String, i64>,
    /// Each side's watermark, µs (never moves back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    left_watermark: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    right_watermark: Option<i64>,
    /// What the plan that wrote this state joins (`None`: a release before plans were
    /// recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plan: Option<JoinSig>,
    /// When each `{table}/{partition}` last landed a row, epoch ms (the round's intent time).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    seen_at: BTreeMap<String, i64>,
    /// The backlog object ([`backlog::Backlog`]): the files of rounds that could not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backlog: Option<String>,
    /// When a round last failed (and was deferred), epoch ms: a later round tries again once
    /// [`RETRY_DEFERRED_MS`] passed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deferred_at_ms: Option<i64>,
}

impl JoinState {
    /// A side's runs, a whole state of an earlier release first.
    fn runs(&self, left: bool) -> Vec<KeptRun> {
        let (legacy, runs) = if left {
            (&self.left, &self.left_runs)
        } else {
            (&self.right, &self.right_runs)
        };
        legacy
            .iter()
            .map(|l| KeptRun {
                location: l.clone(),
                rows: 0,
                merged: true,
            })
            .chain(runs.iter().cloned())
            .collect()
    }

    /// Every kept-rows object it names.
    fn kept_objects(&self) -> impl Iterator<Item = &String> {
        self.left
            .iter()
            .chain(self.right.iter())
            .chain(self.left_runs.iter().map(|r| &r.location))
            .chain(self.right_runs.iter().map(|r| &r.location))
    }
}

/// What a join keeps rows by: the sides, their time columns and the bounds. Kept rows are the
/// sides' own rows, so the rest of the SQL (keys, projection, `WHERE`) may change freely.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct JoinSig {
    left: String,
    right: String,
    left_time: String,
    right_time: String,
    lower_us: i64,
    upper_us: i64,
}

impl JoinSig {
    fn of(j: &IntervalJoin) -> JoinSig {
        JoinSig {
            left: j.left.table.clone(),
            right: j.right.table.clone(),
            left_time: j.left.time_column.clone(),
            right_time: j.right.time_column.clone(),
            lower_us: j.lower_us,
            upper_us: j.upper_us,
        }
    }

    /// Whether rows kept under `self` are rows of the same sides, by the same times.
    fn same_sides(&self, other: &JoinSig) -> bool {
        (&self.left, &self.right, &self.left_time, &self.right_time)
            == (
                &other.left,
                &other.right,
                &other.left_time,
                &other.right_time,
            )
    }
}

/// How long after a deferred round the join tries its backlog again, ms: a round that crashes
/// the process (memory, time) must not take every run down with it.
pub const RETRY_DEFERRED_MS: i64 = 10 * 60_000;

/// The join's state as the snapshot `current` names it.
fn read_state(current: &Table, name: &str) -> Result<JoinState> {
    match current
        .metadata()
        .current_snapshot()
        .and_then(|s| s.summary().additional_properties.get(JOIN_STATE_PROPERTY))
    {
        Some(json) => serde_json::from_str(json).map_err(|e| Error::State {
            op: "read join state",
            message: format!("table {name}: snapshot property {JOIN_STATE_PROPERTY}: {e}"),
            retryable: false,
        }),
        None => Ok(JoinState::default()),
    }
}

/// What the current SQL of join `join` does with the state `current` names (`streamtable
/// check`): `None` when nothing changes, else a line (starting with `!` when kept rows are
/// dropped).
pub fn state_change(current: &Table, name: &str, join: &IntervalJoin) -> Result<Option<String>> {
    let state = read_state(current, name)?;
    let sig = JoinSig::of(join);
    let Some(old) = &state.plan else {
        return Ok(None);
    };
    if *old == sig {
        return Ok(None);
    }
    let kept = state.kept_objects().count();
    if !old.same_sides(&sig) {
        return Ok(Some(format!(
            "! {name}: the join's sides changed ({} ⋈ {} → {} ⋈ {}): its kept rows ({kept} state objects) are dropped; pairs with rows from before the change are never joined",
            old.left, old.right, sig.left, sig.right
        )));
    }
    Ok(Some(format!(
        "{name}: the time bounds changed: kept rows carried over; rows forgotten under the old bounds cannot match under the new ones"
    )))
}

/// What one round of a join produced.
pub(super) struct JoinRound {
    /// The joined rows' files, with the new state in the snapshot properties.
    pub output: TableFiles,
    /// The new rows that came too late to be joined, as dead letters.
    pub late: TableFiles,
    /// State objects the round replaced (deleted once its snapshot landed).
    pub replaced: Vec<String>,
    /// Rows kept for the next round (both sides); bytes and rows written for the state, and
    /// the new rows read.
    pub kept_rows: u64,
    pub state_bytes: u64,
    pub state_rows_written: u64,
    pub new_rows: u64,
    /// Rows forgotten past the kept-rows bound, and partitions idle past their timeout.
    pub evicted_rows: u64,
    pub idle_partitions: u64,
    /// Backlog files that were gone when the round read them.
    pub backlog_files_lost: u64,
}

/// `paths` (the first `waiting` of them the backlog's) without the backlog files that no
/// longer exist, and how many those were.
async fn present(
    backend: &Backend,
    paths: Vec<(String, bool)>,
    waiting: usize,
) -> Result<(Vec<(String, bool)>, u64)> {
    let mut out = Vec::with_capacity(paths.len());
    let mut lost = 0;
    for (i, (p, judged)) in paths.into_iter().enumerate() {
        if i < waiting && backend.warehouse.stat(&p).await?.is_none() {
            lost += 1;
            continue;
        }
        out.push((p, judged));
    }
    Ok((out, lost))
}

/// How a deferred round came to be deferred.
pub(super) struct Deferral {
    /// The round was tried and failed (else it waited for an earlier deferral's retry): the
    /// retry clock starts again.
    pub tried: bool,
}

/// A round that could not run: the same state, with the round's files added to the backlog
/// (the join table gets an empty snapshot under the round's commit id); also the backlog
/// object it replaces.
#[allow(clippy::too_many_arguments)]
pub(super) async fn deferred_state(
    backend: &Backend,
    current: &Table,
    name: &str,
    intent_id: &str,
    left_files: &[DataFile],
    right_files: &[DataFile],
    now_ms: i64,
    how: Deferral,
) -> Result<(TableFiles, Option<String>)> {
    let mut state = read_state(current, name)?;
    let mut backlog = read_backlog(backend, name, state.backlog.as_deref()).await?;
    // A deferral recomputed after a crash adds its round once.
    if !backlog.rounds.iter().any(|r| r.intent == intent_id) {
        backlog.rounds.push(backlog::Round {
            intent: intent_id.to_string(),
            left: left_files
                .iter()
                .map(|f| f.file_path().to_string())
                .collect(),
            right: right_files
                .iter()
                .map(|f| f.file_path().to_string())
                .collect(),
        });
    }
    let replaced = state.backlog.take();
    state.backlog = Some(backlog.write(backend, name, intent_id).await?);
    if how.tried {
        state.deferred_at_ms = Some(now_ms);
    }
    let json = serde_json::to_string(&state).map_err(|e| Error::Internal(e.to_string()))?;
    let mut out = TableFiles::default();
    out.properties.insert(JOIN_STATE_PROPERTY.to_string(), json);
    Ok((out, replaced))
}

/// The data files the current backlog of join `name` names (maintenance keeps them).
pub async fn backlog_files(backend: &Backend, current: &Table, name: &str) -> Result<Vec<String>> {
    let state = read_state(current, name)?;
    let backlog = read_backlog(backend, name, state.backlog.as_deref()).await?;
    Ok(backlog.files().cloned().collect())
}

/// The backlog the state names; one that is gone (a lifecycle rule, a hand) or unreadable is
/// logged and taken as empty, never a join — or the intent, and with it every table — stopped.
async fn read_backlog(backend: &Backend, name: &str, location: Option<&str>) -> Result<Backlog> {
    match Backlog::read(backend, location).await {
        Ok(b) => Ok(b),
        Err(e) if e.is_retryable() => Err(e),
        Err(e) => {
            tracing::error!(table = %name, backlog = ?location, error = %e,
                "interval join: its backlog cannot be read; the rows it named are not joined");
            Ok(Backlog::default())
        }
    }
}

/// The state objects (kept rows, backlog) a snapshot summary's join state names.
pub fn state_objects(summary_json: &str) -> Option<Vec<String>> {
    let state: JoinState = serde_json::from_str(summary_json).ok()?;
    Some(
        state
            .kept_objects()
            .chain(state.backlog.iter())
            .cloned()
            .collect(),
    )
}

/// Whether join `name` has a backlog whose last deferral is younger than
/// [`RETRY_DEFERRED_MS`]: the round is deferred again without being tried.
pub(super) fn backlog_waits(current: &Table, name: &str, now_ms: i64) -> Result<bool> {
    let state = read_state(current, name)?;
    Ok(state
        .deferred_at_ms
        .is_some_and(|at| now_ms < at.saturating_add(RETRY_DEFERRED_MS)))
}

/// Runs one round of join `name` on the files the intent lands for its two sides.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_join(
    backend: &Backend,
    tables: &TableSet,
    name: &str,
    join: &IntervalJoin,
    intent_id: &str,
    failed_at_us: i64,
    current: &Table,
    left_files: &[DataFile],
    right_files: &[DataFile],
    max_kept_rows: usize,
) -> Result<JoinRound> {
    let now_ms = failed_at_us / 1000;
    let mut state = read_state(current, name)?;
    // State objects the round replaces, whatever the plan keeps of them.
    let originals: Vec<String> = state
        .kept_objects()
        .chain(state.backlog.iter())
        .cloned()
        .collect();
    let mut backlog = read_backlog(backend, name, state.backlog.as_deref()).await?;
    let sig = JoinSig::of(join);
    match &state.plan {
        Some(old) if !old.same_sides(&sig) => {
            tracing::warn!(table = %name, was = ?old, now = ?sig,
                "the join's sides changed: its kept rows and backlog are dropped");
            state.left = None;
            state.right = None;
            state.left_runs.clear();
            state.right_runs.clear();
            backlog = Backlog::default();
            state.left_watermark = None;
            state.right_watermark = None;
        }
        Some(old) if *old != sig => {
            tracing::info!(table = %name, was = ?old, now = ?sig,
                "the join's time bounds changed: kept rows carried over");
        }
        _ => {}
    }
    let left_layout = catalog_layout(backend, tables, &join.left.table).await?;
    let right_layout = catalog_layout(backend, tables, &join.right.table).await?;
    // The backlog's files first (a file compaction replaced and expiry deleted although
    // maintenance keeps them — a day of deferrals under an old release — is skipped and
    // counted), then the round's own.
    // The files whose late rows an attempt that failed committed already.
    let dl_history = backend
        .catalog
        .load(&tables.ident(DEAD_LETTER_TABLE))
        .await?
        .map(|(t, _)| t);
    let judged = backlog.judged(|intent| {
        dl_history
            .as_ref()
            .is_some_and(|t| super::find_commit(t, &format!("{intent}/{name}/late")).is_some())
    });
    let (waiting_left, waiting_right) = backlog.sides();
    let paths = |files: &[DataFile], waiting: &[String]| -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = waiting
            .iter()
            .map(|p| (p.clone(), judged.contains(p)))
            .collect();
        out.extend(files.iter().map(|f| (f.file_path().to_string(), false)));
        out
    };
    let (left_paths, left_lost) = present(
        backend,
        paths(left_files, &waiting_left),
        waiting_left.len(),
    )
    .await?;
    let (right_paths, right_lost) = present(
        backend,
        paths(right_files, &waiting_right),
        waiting_right.len(),
    )
    .await?;
    let lost = left_lost + right_lost;
    if lost > 0 {
        tracing::error!(table = %name, files = lost,
            "interval join: files of the backlog are gone (deleted by expiry); their rows are not joined");
    }
    let (left_runs, right_runs) = (state.runs(true), state.runs(false));
    own_objects(
        backend.warehouse.root(),
        name,
        left_runs.iter().chain(&right_runs),
    )?;
    let left = side(backend, &left_layout, &join.left, &left_runs, &left_paths).await?;
    let right = side(
        backend,
        &right_layout,
        &join.right,
        &right_runs,
        &right_paths,
    )
    .await?;

    // Late rows, judged against the watermarks before the round.
    let late_left = late_mask(&left.new_times, state.left_watermark);
    let late_right = late_mask(&right.new_times, state.right_watermark);
    let mut next = state.clone();
    next.plan = Some(sig);
    next.backlog = None;
    next.deferred_at_ms = None;
    for (s, spec) in [(&left, &join.left), (&right, &join.right)] {
        let partitions = column::<Int32Array>(&s.new, crate::kafka::PARTITION)?;
        for (i, t) in s.new_times.iter().enumerate() {
            if let (Some(t), true) = (t, partitions.is_valid(i)) {
                let key = format!("{}/{}", spec.table, partitions.value(i));
                next.seen_at.insert(key.clone(), now_ms);
                let e = next.max.entry(key).or_insert(*t);
                *e = (*e).max(*t);
            }
        }
    }
    // Partitions a release before this one recorded no landing time for: seen now.
    for key in next.max.keys() {
        if !next.seen_at.contains_key(key) {
            next.seen_at.insert(key.clone(), now_ms);
        }
    }
    let (left_wm, left_idle) = watermark(&next, &join.left, now_ms);
    let (right_wm, right_idle) = watermark(&next, &join.right, now_ms);
    // A side whose every partition is idle follows the other side's watermark (Flink: an idle
    // input does not hold a two-input operator back).
    let left_wm = left_wm.or(if left_idle > 0 { right_wm } else { None });
    let right_wm = right_wm.or(if right_idle > 0 { left_wm } else { None });
    next.left_watermark = left_wm.max(state.left_watermark);
    next.right_watermark = right_wm.max(state.right_watermark);

    // The join over kept and on-time new rows.
    let left_on_time = filter_record_batch(&left.new, &not(&late_left)).map_err(arrow)?;
    let right_on_time = filter_record_batch(&right.new, &not(&late_right)).map_err(arrow)?;
    let ctx = SessionContext::new();
    // The SQL's calls behind the guard, as a derived table's are in ingest: a record's values
    // cannot make one allocate without bound.
    let max_record_bytes = tables.max_record_bytes;
    let builtin: Vec<_> = ctx.state().scalar_functions().values().cloned().collect();
    for f in streamtable_process::guard::guarded_functions(
        builtin,
        streamtable_process::guard::Limits::for_records(max_record_bytes),
    ) {
        ctx.register_udf(f);
    }
    register(&ctx, &join.left.table, &left.kept, &left_on_time)?;
    register(&ctx, &join.right.table, &right.kept, &right_on_time)?;
    let fail = |e: datafusion::error::DataFusionError| {
        Error::Internal(format!("interval join {name}: {e}"))
    };
    let joined = ctx
        .sql(&join.sql)
        .await
        .map_err(fail)?
        .collect()
        .await
        .map_err(fail)?;
    let layout = tables.catalog_layout(name, current)?;
    let location = current
        .metadata()
        .location()
        .trim_end_matches('/')
        .to_string();
    let mut output = TableFiles::default();
    // One batch in a canonical order: the files' bytes, and so their content-hashed names, are
    // a function of the round's input, whatever batches DataFusion's threads produced.
    let mut conformed = Vec::with_capacity(joined.len());
    for batch in joined.iter().filter(|b| b.num_rows() > 0) {
        conformed.push(conform(&with_kafka_columns(batch)?, &layout)?);
    }
    if !conformed.is_empty() {
        let rows = concat_batches(&layout.arrow_schema, &conformed).map_err(arrow)?;
        let rows = sorted(&rows)?;
        add_files(
            backend,
            &layout,
            &rows,
            &location,
            &format!("join-{intent_id}"),
            &mut output,
        )
        .await?;
    }

    // What can still match.
    let left_all =
        concat_batches(&left.kept.schema(), [&left.kept, &left_on_time]).map_err(arrow)?;
    let right_all =
        concat_batches(&right.kept.schema(), [&right.kept, &right_on_time]).map_err(arrow)?;
    let mask_left = keep_mask(&left_all, &join.left.time_column, |t| {
        next.right_watermark
            .is_none_or(|wm| t.saturating_add(join.upper_us) >= wm)
    })?;
    let mask_right = keep_mask(&right_all, &join.right.time_column, |t| {
        next.left_watermark
            .is_none_or(|wm| t.saturating_sub(join.lower_us) >= wm)
    })?;
    let keep_left = filter_record_batch(&left_all, &mask_left).map_err(arrow)?;
    let keep_right = filter_record_batch(&right_all, &mask_right).map_err(arrow)?;
    // Bounded whatever the watermarks do: past the bound, the oldest rows are forgotten.
    let (keep_left, evicted_left) = newest(&keep_left, &join.left.time_column, max_kept_rows)?;
    let (keep_right, evicted_right) = newest(&keep_right, &join.right.time_column, max_kept_rows)?;
    if evicted_left + evicted_right > 0 {
        tracing::warn!(table = %name, evicted_left, evicted_right, max_kept_rows,
            "interval join: more rows can still match than the join keeps; the oldest were forgotten (their later partners will not join)");
    }
    let root = backend.warehouse.root().trim_end_matches('/').to_string();
    let (mut state_bytes, mut state_rows_written) = (0, 0);
    let prefix = format!("{root}/_state/join/{name}/{intent_id}");
    for (which, runs, s, all, mask, evicted, kept) in [
        (
            "left",
            &left_runs,
            &left,
            &left_all,
            &mask_left,
            evicted_left,
            &keep_left,
        ),
        (
            "right",
            &right_runs,
            &right,
            &right_all,
            &mask_right,
            evicted_right,
            &keep_right,
        ),
    ] {
        let (new_runs, written, rows_written) = next_runs(
            backend,
            &format!("{prefix}-{which}"),
            runs,
            &s.kept_counts,
            all,
            mask,
            (evicted > 0).then_some(kept),
        )
        .await?;
        state_bytes += written;
        state_rows_written += rows_written;
        if which == "left" {
            next.left = None;
            next.left_runs = new_runs;
        } else {
            next.right = None;
            next.right_runs = new_runs;
        }
    }
    let json = serde_json::to_string(&next).map_err(|e| Error::Internal(e.to_string()))?;
    output
        .properties
        .insert(JOIN_STATE_PROPERTY.to_string(), json);

    // Late rows as dead letters.
    let dl_def = tables.get(DEAD_LETTER_TABLE)?;
    let mut dead = DeadLetterBuilder::new(dl_def.layout.clone(), failed_at_us);
    for (s, spec, mask, wm, other) in [
        (
            &left,
            &join.left,
            &late_left,
            state.left_watermark,
            &join.right,
        ),
        (
            &right,
            &join.right,
            &late_right,
            state.right_watermark,
            &join.left,
        ),
    ] {
        dead_letters(&mut dead, name, s, spec, mask, wm, other)?;
    }
    let mut late = TableFiles::default();
    if !dead.is_empty() {
        let rows = dead.finish()?;
        let dl_table = backend
            .catalog
            .load(&tables.ident(DEAD_LETTER_TABLE))
            .await?
            .map(|(t, _)| t.metadata().location().trim_end_matches('/').to_string())
            .unwrap_or_else(|| {
                backend
                    .warehouse
                    .table_location(&tables.namespace, DEAD_LETTER_TABLE)
            });
        add_files(
            backend,
            &dl_def.layout,
            &rows,
            &dl_table,
            &format!("join-{name}-{intent_id}"),
            &mut late,
        )
        .await?;
    }
    let still: std::collections::HashSet<&String> = next.kept_objects().collect();
    let replaced = originals
        .into_iter()
        .filter(|old| !still.contains(old))
        .collect();
    Ok(JoinRound {
        output,
        late,
        replaced,
        kept_rows: (keep_left.num_rows() + keep_right.num_rows()) as u64,
        state_bytes,
        state_rows_written,
        new_rows: (left.new.num_rows() + right.new.num_rows()) as u64,
        evicted_rows: (evicted_left + evicted_right) as u64,
        idle_partitions: (left_idle + right_idle) as u64,
        backlog_files_lost: lost,
    })
}

/// `rows` sorted by every column (a canonical order).
fn sorted(rows: &RecordBatch) -> Result<RecordBatch> {
    let converter = arrow_row::RowConverter::new(
        rows.schema()
            .fields()
            .iter()
            .map(|f| arrow_row::SortField::new(f.data_type().clone()))
            .collect(),
    )
    .map_err(arrow)?;
    let keys = converter.convert_columns(rows.columns()).map_err(arrow)?;
    let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
    order.sort_by(|a, b| keys.row(*a as usize).cmp(&keys.row(*b as usize)));
    let indices = arrow_array::UInt32Array::from(order);
    arrow_select::take::take_record_batch(rows, &indices).map_err(arrow)
}

/// A side's watermark: the lowest highest event time of its partitions that landed a row
/// within their `idle_timeout` of `now_ms`, minus its out-of-orderness; and how many of its
/// partitions are idle.
fn watermark(state: &JoinState, side: &JoinSide, now_ms: i64) -> (Option<i64>, usize) {
    let prefix = format!("{}/", side.table);
    let mut idle = 0;
    let mut low: Option<i64> = None;
    for (k, t) in state.max.iter().filter(|(k, _)| k.starts_with(&prefix)) {
        let seen = state.seen_at.get(k).copied().unwrap_or(now_ms);
        if seen.saturating_add(side.idle_timeout_ms) <= now_ms {
            idle += 1;
        } else {
            low = Some(low.map_or(*t, |l| l.min(*t)));
        }
    }
    (
        low.map(|t| t.saturating_sub(side.out_of_orderness_us)),
        idle,
    )
}

/// The `limit` rows of `rows` with the latest times in `column` (in their order), and how
/// many were left out.
fn newest(rows: &RecordBatch, column: &str, limit: usize) -> Result<(RecordBatch, usize)> {
    if rows.num_rows() <= limit {
        return Ok((rows.clone(), 0));
    }
    let times = rows::times(rows, column)?;
    let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(times[i as usize]));
    order.truncate(limit);
    order.sort_unstable();
    let indices = arrow_array::UInt32Array::from(order);
    let kept = arrow_select::take::take_record_batch(rows, &indices).map_err(arrow)?;
    Ok((kept, rows.num_rows() - limit))
}

/// [`TableSet::catalog_layout`] of a side of the join, loaded from the catalog.
async fn catalog_layout(backend: &Backend, tables: &TableSet, name: &str) -> Result<TableLayout> {
    match backend.catalog.load(&tables.ident(name)).await? {
        Some((table, _)) => tables.catalog_layout(name, &table),
        None => Ok(tables.get(name)?.layout.as_ref().clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_of_the_release_before_runs_is_read_as_its_oldest_runs() {
        // Kept rows as one object per side, as the release before runs wrote them.
        let old = r#"{"left":"w/_state/join/j/i1-left-00.parquet","right":"w/_state/join/j/i1-right-00.parquet","max":{"orders/0":5}}"#;
        let state: JoinState = serde_json::from_str(old).unwrap();
        let left = state.runs(true);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].location, "w/_state/join/j/i1-left-00.parquet");
        assert!(
            left[0].merged,
            "never merged again: replaced when its rows are done"
        );
        let mut objects = state_objects(old).unwrap();
        objects.sort();
        assert_eq!(
            objects,
            vec![
                "w/_state/join/j/i1-left-00.parquet",
                "w/_state/join/j/i1-right-00.parquet"
            ]
        );
        // A state with runs names each of them (clean-up keeps them).
        let new = JoinState {
            left_runs: vec![
                KeptRun {
                    location: "a".into(),
                    rows: 3,
                    merged: true,
                },
                KeptRun {
                    location: "b".into(),
                    rows: 1,
                    merged: false,
                },
            ],
            right_runs: vec![KeptRun {
                location: "c".into(),
                rows: 2,
                merged: false,
            }],
            backlog: Some("d".into()),
            ..Default::default()
        };
        let json = serde_json::to_string(&new).unwrap();
        let mut objects = state_objects(&json).unwrap();
        objects.sort();
        assert_eq!(objects, vec!["a", "b", "c", "d"]);
        let back: JoinState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, new);
    }
}
