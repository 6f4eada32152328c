//! Compaction: small files become target-size files, in one `replace` snapshot per partition.
//!
//! Per table and partition, when at least [`CompactOptions::min_input_files`] live files are
//! below [`CompactOptions::small_file_ratio`] of the table's target size, they are rewritten
//! ([`rewrite`]) and swapped for the outputs in one `replace` commit ([`replace`]). Readers see
//! every row exactly once before and after.

pub mod apply;
pub mod rewrite;
mod row_group;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use iceberg::spec::{ManifestEntryRef, Struct};
use iceberg::table::Table;
use serde::Serialize;

use crate::backend::Backend;
use crate::error::Result;
use crate::failure::Failure;
use crate::partition::partition_path;
use crate::table::files;
use crate::table::lock::Turns;
use crate::table::replace::{self, ReplaceOutcome};
use crate::tables::TableSet;

/// A rewrite rate every path reaches (re-encoding measures 22-26 MB/s per core): what the time
/// left before a deadline is converted into a byte cap with.
pub const REWRITE_BYTES_PER_SEC_FLOOR: u64 = 10 * 1024 * 1024;

/// Knobs of compaction. `Default` gives the documented defaults.
#[derive(Debug, Clone)]
pub struct CompactOptions {
    /// Rewrite a partition once it has at least this many small files.
    pub min_input_files: usize,
    /// A file is small below this fraction of the table's target size.
    pub small_file_ratio: f64,
    /// Stop starting new rewrites after this many input bytes in one run (the rest waits for
    /// the next run, so a run fits the Lambda timeout).
    pub max_rewrite_bytes_per_run: u64,
    /// Input row groups at least this large (compressed bytes) are copied into the output as
    /// they are; smaller ones are decoded and re-encoded into full-size row groups.
    pub stitch_min_row_group_bytes: u64,
    /// Decoded bytes at which a re-encoded output row group is closed (whatever its rows).
    pub max_row_group_bytes: usize,
    /// Size tiers: `Some(r)` (at least 1) rewrites a run of a partition's small files by
    /// size, each next one taken while it is at most `r` times the files taken before it
    /// together ([`tier`]), so a compacted file waits until smaller files add up to 1/`r` of
    /// its size instead of being rewritten by every run (with `r` = 2 each byte is rewritten
    /// at most about log₁.₅(small bound / first file) times before it leaves the small files,
    /// not once per run). When no run qualifies, every small file, as without tiers. `None`:
    /// every small file, every run. Default [`DEFAULT_TIER_RATIO`].
    pub tier_ratio: Option<f64>,
    /// A data file of at most this many bytes is rewritten as soon as rows of it are deleted;
    /// a larger one once [`DELETED_SHARE_TO_REWRITE`] of its rows are, or
    /// [`DELETE_FILES_TO_REWRITE`] delete files name it. Default
    /// [`REWRITE_WITH_DELETES_BELOW`].
    pub rewrite_with_deletes_below: u64,
    /// Runs the tables' planning and the partitions' rewrites in parallel.
    pub runner: crate::scheduled::runner::Runner,
}

/// The default size-tier ratio: a compacted file is rewritten once the smaller files beside it
/// add up to half its size (without tiers the day's compacted file is rewritten by every run,
/// ~34 times at 3 MB of Parquet a minute; with 2, each byte at most ~9 times).
pub const DEFAULT_TIER_RATIO: f64 = 2.0;

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            min_input_files: 5,
            small_file_ratio: 0.75,
            max_rewrite_bytes_per_run: 8 * 1024 * 1024 * 1024,
            stitch_min_row_group_bytes: rewrite::STITCH_MIN_ROW_GROUP_BYTES,
            max_row_group_bytes: rewrite::ROW_GROUP_BYTES,
            tier_ratio: Some(DEFAULT_TIER_RATIO),
            rewrite_with_deletes_below: REWRITE_WITH_DELETES_BELOW,
            runner: crate::scheduled::runner::Runner::per_core(),
        }
    }
}

/// What compaction did to one partition.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PartitionCompaction {
    /// The table.
    pub table: String,
    /// The partition's path.
    pub partition: String,
    /// Small files rewritten.
    pub input_files: u64,
    /// Their bytes.
    pub input_bytes: u64,
    /// Files written.
    pub output_files: u64,
    /// Their bytes.
    pub output_bytes: u64,
    /// Rows moved.
    pub rows: u64,
    /// The replace snapshot; `None` if another writer had already rewritten the inputs.
    pub snapshot_id: Option<i64>,
    /// Time the rewrite and commit took.
    pub duration_ms: f64,
}

/// A partition's rewrite job.
pub struct Job {
    /// The partition tuple.
    pub partition: Struct,
    /// The partition's path (`created_at_day=2026-11-29`).
    pub path: String,
    /// Its small files, sorted by path (and its files with deleted rows).
    pub inputs: Vec<ManifestEntryRef>,
    /// The table's live delete files, when some of them name rows of the inputs: the job
    /// then drops those rows ([`apply`]).
    pub deletes: Option<std::sync::Arc<apply::TableDeletes>>,
    /// For a job without deletes: the delete files live when it was planned, none of which
    /// names its inputs (else they would be its deletes), so that its replace checks only
    /// delete files that came later.
    pub seen: Option<std::sync::Arc<HashSet<String>>>,
}

/// Compacts every table of the set; the first failure is returned (see [`compact_all_until`]
/// for the scheduled stage's isolated form).
pub async fn compact_all(
    backend: &Backend,
    tables: &TableSet,
    options: &CompactOptions,
) -> Result<Vec<PartitionCompaction>> {
    let far = Instant::now() + std::time::Duration::from_secs(24 * 3600);
    let (done, failures) = compact_all_until(backend, tables, options, far).await;
    match failures.into_iter().next() {
        Some(f) => Err(crate::Error::Internal(format!(
            "compaction of {} {} failed: {}",
            f.table.unwrap_or_default(),
            f.partition.unwrap_or_default(),
            f.error
        ))),
        None => Ok(done),
    }
}

/// Compacts every table of the set, starting no rewrite after `deadline` and rewriting at most
/// [`CompactOptions::max_rewrite_bytes_per_run`] in all. A partition with more small files than
/// the budget has the first by path (with size tiers, the smallest) rewritten now and the rest
/// in later runs. A table or partition
/// that fails is reported and the others go on.
pub async fn compact_all_until(
    backend: &Backend,
    tables: &TableSet,
    options: &CompactOptions,
    deadline: Instant,
) -> (Vec<PartitionCompaction>, Vec<Failure>) {
    let mut out = Vec::new();
    let mut failures = Vec::new();
    let shared = Arc::new(tables.clone());
    // Units of planning: one per table, in parallel.
    let names: Vec<String> = tables.tables.keys().cloned().collect();
    let planned = options
        .runner
        .run(names.clone(), |name| {
            let (backend, tables, options) = (backend.clone(), shared.clone(), options.clone());
            async move { plan_table(&backend, &tables, &name, &options).await }
        })
        .await;
    // Every table's jobs first, then the smallest first: a partition larger than the budget
    // (a backfill) gets what is left, capped, and never stops the others.
    let mut jobs = Vec::new();
    for (name, planned) in names.into_iter().zip(planned) {
        match planned {
            Ok(Ok(picked)) => {
                for (table, job) in picked {
                    jobs.push((name.clone(), table, job));
                }
            }
            Ok(Err(e)) => failures.push(Failure::new("compaction", Some(&name), None, &e)),
            Err(panic) => failures.push(Failure::new(
                "compaction",
                Some(&name),
                None,
                &crate::Error::Internal(panic.to_string()),
            )),
        }
    }
    jobs.sort_by_key(|(name, _, job)| (job.input_bytes(), name.clone(), job.path.clone()));
    // Units of rewriting: one per partition, in parallel, started smallest first; each takes
    // its share of the run's byte budget as it starts.
    let budget = Arc::new(Mutex::new(options.max_rewrite_bytes_per_run));
    let turns = Turns::default();
    let described: Vec<(String, String)> = jobs
        .iter()
        .map(|(name, _, job)| (name.clone(), job.path.clone()))
        .collect();
    let done = options
        .runner
        .run(jobs, |(name, table, job)| {
            let (backend, tables, options, budget, turns) = (
                backend.clone(),
                shared.clone(),
                options.clone(),
                budget.clone(),
                turns.clone(),
            );
            async move {
                let Some(job) = take_budget(&budget, &options, &name, job, deadline) else {
                    return Ok(None);
                };
                let def = tables.get(&name)?;
                let ident = tables.ident(&name);
                compact_job(
                    &backend, &tables, &table, &ident, &name, def, &job, &options, &turns,
                )
                .await
            }
        })
        .await;
    for ((name, path), result) in described.into_iter().zip(done) {
        match result {
            Ok(Ok(Some(report))) => out.push(report),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => failures.push(Failure::new("compaction", Some(&name), Some(&path), &e)),
            Err(panic) => failures.push(Failure::new(
                "compaction",
                Some(&name),
                Some(&path),
                &crate::Error::Internal(panic.to_string()),
            )),
        }
    }
    (out, failures)
}

/// A table's compaction jobs (none when the table does not exist yet or has equality deletes).
async fn plan_table(
    backend: &Backend,
    tables: &TableSet,
    name: &str,
    options: &CompactOptions,
) -> Result<Vec<(Arc<Table>, Job)>> {
    let def = tables.get(name)?;
    let Some((table, _)) = backend.catalog.load(&tables.ident(name)).await? else {
        return Ok(Vec::new());
    };
    let current = files::load_current(&table).await?;
    let deletes = apply::TableDeletes::load(&table, &current).await?;
    if deletes.equality {
        tracing::warn!(table = %name, "the table has equality delete files, which compaction does not apply; it is left as it is");
        return Ok(Vec::new());
    }
    let small_below = (def.target_file_size_bytes as f64 * options.small_file_ratio) as u64;
    let mut picked = plan(
        &table,
        current.live(),
        small_below,
        options.min_input_files,
        options.tier_ratio,
    );
    let seen = Arc::new(deletes.seen.clone());
    if !deletes.is_empty() {
        with_deleted_rows(
            &table,
            &current,
            &mut picked,
            deletes,
            options.rewrite_with_deletes_below,
        );
    }
    for job in picked.iter_mut().filter(|j| j.deletes.is_none()) {
        job.seen = Some(seen.clone());
    }
    let table = Arc::new(table);
    Ok(picked.into_iter().map(|job| (table.clone(), job)).collect())
}

/// `job` cut to what is left of the run's byte budget and time, the budget taken; `None` when
/// the run is out of either (the rest waits for the next run).
fn take_budget(
    budget: &Mutex<u64>,
    options: &CompactOptions,
    name: &str,
    mut job: Job,
    deadline: Instant,
) -> Option<Job> {
    if Instant::now() >= deadline {
        tracing::info!(table = %name, partition = %job.path, "compaction time of this run used up; the rest waits for the next run");
        return None;
    }
    // A rewrite cannot be interrupted: cap it to what the time left can rewrite at a
    // conservative rate, so that it ends by the deadline; with more units at once than cores,
    // each gets its share of a core.
    let left = deadline
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
    let share = (crate::scheduled::runner::default_concurrency() as f64
        / options.runner.concurrency() as f64)
        .min(1.0);
    let time_cap = (left * share * REWRITE_BYTES_PER_SEC_FLOOR as f64) as u64;
    // With size tiers a cut keeps the smallest files: a large one rewritten with a few small
    // ones would undo the tier.
    let smallest_first = options.tier_ratio.is_some();
    // A file with deleted rows is worth rewriting on its own.
    let min_files = if job.deletes.is_some() {
        1
    } else {
        options.min_input_files.max(2)
    };
    // A poisoned budget only means a unit panicked while holding it: the number is intact.
    let mut budget = budget.lock().unwrap_or_else(|p| p.into_inner());
    if !job.fit_budget((*budget).min(time_cap), min_files, smallest_first) {
        tracing::info!(table = %name, partition = %job.path, "compaction byte budget of this run used up for this partition");
        return None;
    }
    *budget -= job.input_bytes().min(*budget);
    Some(job)
}

impl Job {
    fn input_bytes(&self) -> u64 {
        self.inputs.iter().map(|e| e.file_size_in_bytes()).sum()
    }

    /// Keeps the first inputs (in path order; with `smallest_first`, by size, kept in path
    /// order) that fit `budget` bytes; false when fewer than `min_files` do.
    fn fit_budget(&mut self, budget: u64, min_files: usize, smallest_first: bool) -> bool {
        let mut order: Vec<usize> = (0..self.inputs.len()).collect();
        if smallest_first {
            order.sort_by_key(|&i| self.inputs[i].file_size_in_bytes());
        }
        let mut total = 0u64;
        let fit = order
            .iter()
            .take_while(|&&i| {
                total = total.saturating_add(self.inputs[i].file_size_in_bytes());
                total <= budget
            })
            .count();
        let mut keep = vec![false; self.inputs.len()];
        for &i in &order[..fit] {
            keep[i] = true;
        }
        let mut i = 0;
        self.inputs.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        fit >= min_files.max(1)
    }
}

/// Rewrites one partition's small files and commits the replace; `None` when there was nothing
/// to do.
#[allow(clippy::too_many_arguments)]
async fn compact_job(
    backend: &Backend,
    tables: &TableSet,
    table: &iceberg::table::Table,
    ident: &iceberg::TableIdent,
    name: &str,
    def: &crate::tables::TableDef,
    job: &Job,
    options: &CompactOptions,
    turns: &Turns,
) -> Result<Option<PartitionCompaction>> {
    let started = Instant::now();
    let prefix = format!("compact-{}", uuid::Uuid::new_v4());
    let rewritten = match &job.deletes {
        Some(deletes) => {
            let layout = tables.catalog_layout(name, table)?;
            apply::rewrite(
                table,
                &layout,
                job,
                deletes,
                &prefix,
                def.target_file_size_bytes,
            )
            .await?
        }
        None => {
            rewrite::rewrite(
                table,
                job,
                def.target_file_size_bytes,
                options.stitch_min_row_group_bytes,
                options.max_row_group_bytes,
                &prefix,
            )
            .await?
        }
    };
    if rewritten.outputs.is_empty() && rewritten.removed.is_empty() {
        return Ok(None);
    }
    let outputs = rewritten.outputs;
    let dropped = rewritten.dropped;
    let removed: HashSet<String> = rewritten.removed.into_iter().collect();
    let applied = match &job.deletes {
        Some(d) => replace::Deletes {
            removed: d.covered_by(&removed),
            seen: Some(d.seen.clone()),
        },
        None => replace::Deletes {
            removed: HashSet::new(),
            seen: job.seen.as_ref().map(|s| (**s).clone()),
        },
    };
    let input_bytes: u64 = job
        .inputs
        .iter()
        .filter(|e| removed.contains(e.file_path()))
        .map(|e| e.file_size_in_bytes())
        .sum();
    let props = HashMap::from([(
        "streamtable.operation".to_string(),
        "compaction".to_string(),
    )]);
    // A topic's own upsert table counts the rows the rewrite dropped (superseded or deleted),
    // in the replace's metadata commit: the audit accounts for every record it was delivered.
    let counted_topic = def
        .spec
        .as_ref()
        .filter(|s| {
            s.upsert.is_some()
                && tables.topic_tables.get(&s.topic).map(String::as_str) == Some(name)
        })
        .map(|s| s.topic.clone())
        .filter(|_| !dropped.is_empty());
    // Rewrites of a table's partitions run in parallel; their commits take turns.
    let _turn = turns.take(name).await;
    let outcome = replace::commit_replace_setting(
        &backend.catalog,
        ident,
        &removed,
        &applied,
        &outputs,
        &props,
        &|t: &iceberg::table::Table| match &counted_topic {
            Some(topic) => crate::commit::ledger::counted(t, topic, &dropped, |c, n| {
                c.dropped = c.dropped.saturating_add(n)
            }),
            None => Vec::new(),
        },
    )
    .await?;
    let snapshot_id = match outcome {
        ReplaceOutcome::Committed(id) => Some(id),
        ReplaceOutcome::Stale => {
            // Not committed, and it never can be (its inputs are gone): the outputs are ours.
            for f in &outputs {
                let _ = table.file_io().delete(f.file_path()).await;
            }
            None
        }
    };
    let report = PartitionCompaction {
        table: name.to_string(),
        partition: job.path.clone(),
        input_files: removed.len() as u64,
        input_bytes,
        output_files: outputs.len() as u64,
        output_bytes: outputs.iter().map(|f| f.file_size_in_bytes()).sum(),
        rows: outputs.iter().map(|f| f.record_count()).sum(),
        snapshot_id,
        duration_ms: started.elapsed().as_secs_f64() * 1e3,
    };
    tracing::info!(table = %ident, partition = %report.partition, inputs = report.input_files,
        outputs = report.output_files, rows = report.rows, snapshot = ?snapshot_id, "compacted");
    Ok(Some(report))
}

/// The size tier of `sizes` (ascending) to rewrite: from the smallest start that gives one of
/// at least `min_files`, its first file and each next one while that is at most `ratio` times
/// the sum of those taken (so files smaller than the next by more than `ratio` do not hold the
/// others back; they join once enough files of their size gather, or in the fallback below).
/// When no start gives one, all of them — a partition that stopped receiving files (yesterday's
/// day) is merged whole once rather than left in small files — but for the largest ones that
/// dwarf the rest ([`undominated`]).
fn tier(sizes: &[u64], ratio: f64, min_files: usize) -> std::ops::Range<usize> {
    for start in 0..sizes.len() {
        let mut sum = 0u64;
        let len = sizes[start..]
            .iter()
            .take_while(|&&s| {
                let take = sum == 0 || s as f64 <= ratio * sum as f64;
                if take {
                    sum = sum.saturating_add(s.max(1));
                }
                take
            })
            .count();
        if len >= min_files.max(2) {
            return start..start + len;
        }
    }
    0..0
}

/// How many of `sizes` (ascending) the fallback takes: all but the largest ones that are each
/// more than `ratio` times all the smaller together (rewriting them would mostly copy them).
fn undominated(sizes: &[u64], ratio: f64) -> usize {
    let mut n = sizes.len();
    while n >= 2 {
        let rest: f64 = sizes[..n - 1].iter().map(|&s| s as f64).sum();
        if sizes[n - 1] as f64 > ratio * rest {
            n -= 1;
        } else {
            break;
        }
    }
    n
}

/// Default of [`CompactOptions::rewrite_with_deletes_below`]: a data file at most this large is
/// rewritten as soon as rows of it are deleted (it is cheap).
pub const REWRITE_WITH_DELETES_BELOW: u64 = 8 * 1024 * 1024;
/// A larger one once this share of its rows is deleted (Iceberg's `delete-ratio-threshold`)...
pub const DELETED_SHARE_TO_REWRITE: f64 = 0.3;
/// ...or once this many delete files name it or its partition's files (what a reader opens
/// with it).
pub const DELETE_FILES_TO_REWRITE: usize = 16;

/// Whether a file with `deleted` of its rows deleted, named by `delete_files` delete files (or
/// its partition by that many), is worth rewriting: an upsert table's round deletes a few rows of every large file it touches,
/// and rewriting each of them every run would cost the whole table per round.
fn worth_rewriting(
    file: &iceberg::spec::DataFile,
    deleted: u64,
    delete_files: usize,
    small: u64,
) -> bool {
    file.file_size_in_bytes() <= small
        || deleted as f64 >= DELETED_SHARE_TO_REWRITE * file.record_count() as f64
        || delete_files >= DELETE_FILES_TO_REWRITE
}

/// Jobs for the files with deleted rows: a file some job rewrites drops them; another joins its
/// partition's job (made when the partition has none) when it is [`worth_rewriting`]. Such
/// jobs drop the deleted rows.
fn with_deleted_rows(
    table: &iceberg::table::Table,
    current: &files::SnapshotFiles,
    jobs: &mut Vec<Job>,
    deletes: apply::TableDeletes,
    small: u64,
) {
    let spec = table.metadata().default_partition_spec();
    let Ok(partition_type) = spec.partition_type(table.metadata().current_schema()) else {
        return;
    };
    let deletes = std::sync::Arc::new(deletes);
    // How many delete files name each file, and each partition's files.
    let mut naming: HashMap<&str, usize> = HashMap::new();
    for names in deletes.names.values() {
        for n in names {
            *naming.entry(n.as_str()).or_default() += 1;
        }
    }
    let partition_of: HashMap<&str, &Struct> = current
        .live()
        .map(|f| (f.entry.file_path(), f.entry.data_file().partition()))
        .collect();
    let mut in_partition: HashMap<&Struct, usize> = HashMap::new();
    for names in deletes.names.values() {
        let partitions: HashSet<&Struct> = names
            .iter()
            .filter_map(|n| partition_of.get(n.as_str()).copied())
            .collect();
        for p in partitions {
            *in_partition.entry(p).or_default() += 1;
        }
    }
    for files::FileEntry { spec_id, entry } in current.live() {
        let Some(gone) = deletes.positions.get(entry.file_path()) else {
            continue;
        };
        if *spec_id != spec.spec_id() {
            continue;
        }
        let partition = entry.data_file().partition();
        let at = jobs.iter().position(|j| &j.partition == partition);
        // A file the job rewrites anyway must drop its deleted rows (a copy would bring them
        // back); another is rewritten only when that is worth it.
        let in_job = at.is_some_and(|i| {
            jobs[i]
                .inputs
                .iter()
                .any(|e| e.file_path() == entry.file_path())
        });
        // A partition's delete files are bounded too: each round that touches it adds one,
        // whose rows may be spread over files none of which reaches the share.
        let delete_files = naming
            .get(entry.file_path())
            .copied()
            .unwrap_or(0)
            .max(in_partition.get(partition).copied().unwrap_or(0));
        if !in_job && !worth_rewriting(entry.data_file(), gone.len() as u64, delete_files, small) {
            continue;
        }
        let job = match at {
            Some(i) => &mut jobs[i],
            None => {
                jobs.push(Job {
                    partition: partition.clone(),
                    path: partition_path(spec, &partition_type, partition),
                    inputs: Vec::new(),
                    deletes: None,
                    seen: None,
                });
                let last = jobs.len() - 1;
                &mut jobs[last]
            }
        };
        if !job
            .inputs
            .iter()
            .any(|e| e.file_path() == entry.file_path())
        {
            job.inputs.push(entry.clone());
        }
        job.deletes = Some(deletes.clone());
    }
    for job in jobs.iter_mut() {
        job.inputs.sort_by(|a, b| a.file_path().cmp(b.file_path()));
    }
}

/// Partitions with enough small files (with `tier_ratio`, enough in their smallest tier),
/// their chosen files sorted by path.
fn plan<'a>(
    table: &iceberg::table::Table,
    live: impl Iterator<Item = &'a files::FileEntry>,
    small_below: u64,
    min_files: usize,
    tier_ratio: Option<f64>,
) -> Vec<Job> {
    let spec = table.metadata().default_partition_spec();
    let Ok(partition_type) = spec.partition_type(table.metadata().current_schema()) else {
        return Vec::new();
    };
    // Grouped by the partition tuple, not its path: a null and the string "null" share a path.
    let mut by_value: HashMap<Struct, Vec<ManifestEntryRef>> = HashMap::new();
    for files::FileEntry { spec_id, entry: e } in live {
        let f = e.data_file();
        if *spec_id != spec.spec_id() || f.file_size_in_bytes() >= small_below {
            continue;
        }
        by_value
            .entry(f.partition().clone())
            .or_default()
            .push(e.clone());
    }
    let mut groups: Vec<(String, (Struct, Vec<ManifestEntryRef>))> = by_value
        .into_iter()
        .map(|(partition, files)| {
            let path = partition_path(spec, &partition_type, &partition);
            (path, (partition, files))
        })
        .collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(ratio) = tier_ratio {
        for (_, (_, files)) in &mut groups {
            files.sort_by(|a, b| {
                (a.data_file().file_size_in_bytes(), a.file_path())
                    .cmp(&(b.data_file().file_size_in_bytes(), b.file_path()))
            });
            let sizes: Vec<u64> = files
                .iter()
                .map(|f| f.data_file().file_size_in_bytes())
                .collect();
            let picked = tier(&sizes, ratio, min_files);
            if !picked.is_empty() {
                files.truncate(picked.end);
                files.drain(..picked.start);
            } else {
                // The fallback, every small file, but a compacted file beside fewer small
                // ones than a tier needs is left out rather than rewritten for them.
                files.truncate(undominated(&sizes, ratio));
            }
        }
    }
    groups
        .into_iter()
        .filter(|(_, (_, files))| files.len() >= min_files)
        .map(|(path, (partition, mut inputs))| {
            inputs.sort_by(|a, b| a.file_path().cmp(b.file_path()));
            Job {
                partition,
                path,
                inputs,
                deletes: None,
                seen: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_file_with_few_deleted_rows_waits_and_a_small_one_does_not() {
        let file = |bytes: u64, rows: u64| {
            iceberg::spec::DataFileBuilder::default()
                .content(iceberg::spec::DataContentType::Data)
                .file_format(iceberg::spec::DataFileFormat::Parquet)
                .file_path("s3://b/w/t/data/f.parquet".into())
                .file_size_in_bytes(bytes)
                .record_count(rows)
                .partition_spec_id(0)
                .partition(Struct::empty())
                .build()
                .expect("data file")
        };
        let large = file(100 * 1024 * 1024, 2_000_000);
        // A round of 10,000 changes over 2M keys deletes 0.5% of the table's rows.
        let small = REWRITE_WITH_DELETES_BELOW;
        assert!(!worth_rewriting(&large, 10_000, 1, small));
        assert!(!worth_rewriting(&large, 599_999, 15, small));
        assert!(
            worth_rewriting(&large, 600_000, 1, small),
            "30% of its rows"
        );
        assert!(
            worth_rewriting(&large, 10_000, 16, small),
            "16 delete files"
        );
        assert!(worth_rewriting(&file(small, 1_000), 1, 1, small));
    }

    #[test]
    fn a_size_tier_takes_the_small_files_and_leaves_a_larger_one_for_later() {
        // A minute's 20 small files beside the day's compacted file of 30 MB: only the small.
        let mut sizes = vec![500_000u64; 20];
        sizes.push(30_000_000);
        assert_eq!(tier(&sizes, 2.0, 2), 0..20);
        // Files of about one size go together.
        assert_eq!(tier(&[10, 12, 15, 19], 2.0, 2), 0..4);
        // Once newer files add up to half its size, it joins them.
        assert_eq!(tier(&[10, 10, 10, 60], 2.0, 2), 0..4);
        assert_eq!(tier(&[10, 10, 10, 61], 2.0, 2), 0..3);
        // A tiny file does not hold the others back; it joins a later tier.
        assert_eq!(tier(&[1, 10, 10, 10, 100], 2.0, 2), 1..4);
        // Too few in any tier: nothing.
        assert_eq!(tier(&[1, 100, 10_000], 2.0, 2), 0..0);
        // The stitch test's mix: three of 20 rows, then 300-row files; no tiers takes all.
        assert_eq!(tier(&[20, 20, 20, 300, 300, 300], 2.0, 2), 0..3);
        assert_eq!(tier(&[20, 20, 20, 300, 300, 300], f64::INFINITY, 2), 0..6);
        assert_eq!(tier(&[], 2.0, 2), 0..0);
        assert_eq!(tier(&[0, 0, 5], 2.0, 2), 0..2);
        assert_eq!(tier(&[u64::MAX, u64::MAX], 2.0, 2), 0..2);
        // At least two files, whatever min_files says.
        assert_eq!(tier(&[1, 100], 2.0, 1), 0..0);
        // Tiers of four at min_files 5: none qualifies (the plan then takes them all).
        assert_eq!(
            tier(&[1, 1, 1, 1, 10, 10, 10, 10, 100, 100, 100, 100], 2.0, 5),
            0..0
        );
        assert_eq!(
            undominated(&[1, 1, 1, 1, 10, 10, 10, 10, 100, 100, 100, 100], 2.0),
            12
        );
    }

    /// Four new small files beside the day's compacted file, one fewer than a tier needs: the
    /// fallback to every small file would rewrite the compacted file for them on every run
    /// that sees four; it waits instead.
    #[test]
    fn a_compacted_file_is_not_rewritten_for_fewer_files_than_a_tier() {
        let sizes = [1_000_000, 1_000_000, 1_000_000, 1_000_000, 30_000_000];
        assert_eq!(tier(&sizes, 2.0, 5), 0..0);
        assert_eq!(undominated(&sizes, 2.0), 4, "the four wait for a fifth");
        // A closed day's files in steps of ~9x, no tier of 5 among them: the small ones are
        // merged, the largest left as it is.
        assert_eq!(tier(&[1, 1, 1, 1, 9, 9, 9, 9, 100], 2.0, 5), 0..0);
        assert_eq!(undominated(&[1, 1, 1, 1, 9, 9, 9, 9, 100], 2.0), 8);
        assert_eq!(undominated(&[1, 100, 10_000], 2.0), 1);
        assert_eq!(undominated(&[10, 10, 10, 60], 2.0), 4);
        assert_eq!((undominated(&[5], 2.0), undominated(&[], 2.0)), (1, 0));
        assert_eq!(undominated(&[0, 0, 0, 7], 2.0), 3);
    }
}
