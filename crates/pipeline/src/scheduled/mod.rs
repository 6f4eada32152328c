//! The scheduled stage (the scheduled Lambda and `streamtable scheduled`): commit, then
//! compaction, then maintenance. Each step is idempotent and safe to re-run after a crash.
//!
//! A run is bounded: the commit step stops starting rounds after [`COMMIT_SHARE`] of the run's
//! time, compaction stops starting rewrites after [`COMPACT_SHARE`], and maintenance uses the
//! rest, so a steady stream of new batches never starves compaction and clean-up. Failures are
//! isolated: a table or partition that fails is reported ([`ScheduledReport::failures`]) and the
//! others proceed.

pub mod runner;

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::Backend;
use crate::commit::{CommitOptions, CommitReport, commit_pending_with};
use crate::compact::{CompactOptions, PartitionCompaction, compact_all_until};
use crate::error::{Error, Result};
use crate::maintenance::{MaintenanceOptions, TableMaintenance, maintain_all_until};
use crate::tables::TableSet;

pub use crate::failure::Failure;

/// Share of a run's time after which no new commit round starts.
pub const COMMIT_SHARE: f64 = 0.4;
/// Share of a run's time after which no new rewrite starts.
pub const COMPACT_SHARE: f64 = 0.8;
/// Most units of work one process runs at once, whatever it is told.
pub const MAX_CONCURRENCY: usize = 256;
/// A run's time when no deadline is given (the CLI).
pub const DEFAULT_RUN_BUDGET: Duration = Duration::from_secs(600);

/// Knobs of the scheduled stage, read the same way by the Lambda and `streamtable scheduled`.
#[derive(Debug, Clone, Default)]
pub struct ScheduledOptions {
    /// The commit step.
    pub commit: CommitOptions,
    /// Compaction.
    pub compaction: CompactOptions,
    /// Expiry, orphan clean-up, manifest merge.
    pub maintenance: MaintenanceOptions,
}

impl ScheduledOptions {
    /// Most units of work run at once (default: one per core).
    pub fn concurrency(&self) -> usize {
        self.commit.runner.concurrency()
    }

    /// Runs at most `n` units of work at once, in every step.
    pub fn set_concurrency(&mut self, n: usize) {
        let runner = runner::Runner::new(n.min(MAX_CONCURRENCY));
        self.commit.runner = runner.clone();
        self.compaction.runner = runner.clone();
        self.maintenance.runner = runner;
    }

    /// These options with every step's units counted into the counters returned.
    fn counted(&self) -> (ScheduledOptions, std::sync::Arc<runner::UnitCounters>) {
        let (runner, counters) = self.commit.runner.clone().counted();
        let mut o = self.clone();
        o.commit.runner = runner;
        o.compaction.runner = o.compaction.runner.clone().counting_into(&counters);
        o.maintenance.runner = o.maintenance.runner.clone().counting_into(&counters);
        (o, counters)
    }

    /// The defaults, overridden by the environment: `STREAMTABLE_COMMIT_INTERVAL_S` (least
    /// seconds between triggered commits), `STREAMTABLE_COMMIT_MAX_ROUNDS`,
    /// `STREAMTABLE_JOIN_MAX_KEPT_ROWS` (rows an interval join keeps per side),
    /// `STREAMTABLE_COMPACT_MIN_FILES`, `STREAMTABLE_COMPACT_TIER_RATIO` (size tiers, see
    /// [`crate::compact::CompactOptions::tier_ratio`]), `STREAMTABLE_COMPACT_MAX_REWRITE_MB`,
    /// `STREAMTABLE_SNAPSHOT_KEEP_LAST`, `STREAMTABLE_SNAPSHOT_RETENTION_HOURS` (at least 1),
    /// `STREAMTABLE_ORPHAN_GRACE_HOURS`, `STREAMTABLE_MAX_MANIFESTS`, `STREAMTABLE_AUDIT_ROUNDS`
    /// (`off`: no audit of each commit round), `STREAMTABLE_SCHEDULED_CONCURRENCY` (most units
    /// of work at once; default one per core), `STREAMTABLE_COMMIT_MAX_ROUND_MB` (most MB of
    /// files one commit round covers).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`ScheduledOptions::from_env`] through `var` (for tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let num = |k: &str, min: u64| -> Result<Option<u64>> {
            match var(k) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n >= min => Ok(Some(n)),
                    _ => Err(Error::Config(format!(
                        "{k}={v:?} is not a whole number of at least {min}"
                    ))),
                },
            }
        };
        let mut o = ScheduledOptions::default();
        if let Some(n) = num("STREAMTABLE_COMMIT_INTERVAL_S", 1)? {
            o.commit.min_interval = std::time::Duration::from_secs(n);
        }
        if let Some(n) = num("STREAMTABLE_COMMIT_MAX_ROUNDS", 1)? {
            o.commit.max_rounds = u32::try_from(n).unwrap_or(u32::MAX);
        }
        if let Some(n) = num("STREAMTABLE_SCHEDULED_CONCURRENCY", 1)? {
            o.set_concurrency(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(n) = num("STREAMTABLE_COMMIT_MAX_ROUND_MB", 1)? {
            o.commit.max_round_bytes = n.saturating_mul(1024 * 1024);
        }
        if let Some(n) = num("STREAMTABLE_JOIN_MAX_KEPT_ROWS", 1)? {
            o.commit.join_max_kept_rows = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(v) = var("STREAMTABLE_AUDIT_ROUNDS") {
            o.commit.audit_rounds = match v.trim().to_ascii_lowercase().as_str() {
                "on" | "true" | "1" => true,
                "off" | "false" | "0" => false,
                _ => {
                    return Err(Error::Config(format!(
                        "STREAMTABLE_AUDIT_ROUNDS={v:?} is not \"on\" (the default: each commit round's files are read back and checked against what its batches were delivered) or \"off\""
                    )));
                }
            };
        }
        if let Some(n) = num("STREAMTABLE_COMPACT_MIN_FILES", 2)? {
            o.compaction.min_input_files = n as usize;
        }
        if let Some(v) = var("STREAMTABLE_COMPACT_TIER_RATIO") {
            match v.trim().parse::<f64>() {
                _ if v.trim().eq_ignore_ascii_case("off") => o.compaction.tier_ratio = None,
                Ok(r) if r.is_finite() && r >= 1.0 => o.compaction.tier_ratio = Some(r),
                _ => {
                    return Err(Error::Config(format!(
                        "STREAMTABLE_COMPACT_TIER_RATIO={v:?} is not a number of at least 1 (2, \
                         the default, merges a compacted file once smaller files add up to half \
                         its size) or \"off\" (every small file, every run)"
                    )));
                }
            }
        }
        if let Some(n) = num("STREAMTABLE_COMPACT_MAX_REWRITE_MB", 1)? {
            o.compaction.max_rewrite_bytes_per_run = n.saturating_mul(1024 * 1024);
        }
        if let Some(n) = num("STREAMTABLE_SNAPSHOT_KEEP_LAST", 1)? {
            o.maintenance.keep_last_snapshots = n as usize;
        }
        if let Some(n) = num("STREAMTABLE_SNAPSHOT_RETENTION_HOURS", 1)? {
            o.maintenance.snapshot_retention_ms = hours_ms(n);
        }
        if let Some(n) = num("STREAMTABLE_ORPHAN_GRACE_HOURS", 1)? {
            o.maintenance.orphan_grace_ms = hours_ms(n);
        }
        if let Some(n) = num("STREAMTABLE_MAX_MANIFESTS", 2)? {
            o.maintenance.max_manifests = n as usize;
        }
        Ok(o)
    }
}

fn hours_ms(hours: u64) -> i64 {
    i64::try_from(hours.saturating_mul(3_600_000)).unwrap_or(i64::MAX)
}

/// What one scheduled run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScheduledReport {
    /// The commit step.
    pub commit: CommitReport,
    /// The partitions compacted.
    pub compaction: Vec<PartitionCompaction>,
    /// Maintenance, per table.
    pub maintenance: Vec<TableMaintenance>,
    /// Steps that failed; the rest of the run was done.
    pub failures: Vec<Failure>,
    /// Pending items of an earlier release's layout moved to this one's.
    pub state_items_upgraded: u64,
    /// Idle partitions whose windows were closed at their topic's watermark.
    pub idle: crate::ingest::IdleFlush,
    /// The units of work the steps ran.
    pub units: runner::UnitStats,
    /// Time the run took.
    pub duration_ms: f64,
}

impl ScheduledReport {
    /// A few lines for humans.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.idle.partitions > 0 {
            out.push(format!(
                "idle partitions: {} had their windows closed at the topic's watermark ({} partial rows)",
                self.idle.partitions, self.idle.rows
            ));
        }
        out.push(format!(
            "commit: {} batches, {} files, {} rows in {:.0} ms",
            self.commit.batches,
            self.commit.files(),
            self.commit.rows(),
            self.commit.duration_ms
        ));
        if self.commit.lease_busy {
            out.push(
                "  another committer (a triggered commit) held the commit lease all the while: it commits; nothing committed by this run".into(),
            );
        }
        if self.commit.lease_lost {
            out.push("  the commit lease was taken over between rounds: the rounds stopped".into());
        }
        for t in &self.commit.tables {
            out.push(match &t.upsert {
                // An upsert table's new rows replace older ones of their keys: say how many,
                // so that the table's size adds up.
                Some(u) => format!(
                    "  {:<16} +{} files, +{} rows written; {} rows superseded or deleted ({} keys deleted by tombstones); {} keys live",
                    t.table, t.files, t.rows, u.rows_deleted, u.keys_deleted, u.keys
                ),
                None => format!("  {:<16} +{} files, +{} rows", t.table, t.files, t.rows),
            });
            match &t.join {
                Some(j) if j.deferred => out.push(format!(
                    "  {:<16} interval join round deferred: its rows wait in the join's backlog (the log says why)",
                    ""
                )),
                Some(j) => out.push(format!(
                    "  {:<16} interval join keeps {} rows for later matches ({}){}{}",
                    "",
                    j.kept_rows,
                    if j.state_bytes > 0 {
                        format!("{} bytes of state written", j.state_bytes)
                    } else {
                        "no new state written".to_string()
                    },
                    match (j.evicted_rows, j.late_rows) {
                        (0, 0) => String::new(),
                        (e, 0) => format!("; {e} forgotten past the bound"),
                        (0, l) => format!(
                            "; {l} new rows too late to join (behind their side's watermark: dead letters of kind late)"
                        ),
                        (e, l) => format!(
                            "; {e} forgotten past the bound; {l} new rows too late to join (dead letters of kind late)"
                        ),
                    },
                    if j.idle_partitions > 0 {
                        format!("; {} idle partitions not holding it back", j.idle_partitions)
                    } else {
                        String::new()
                    }
                )),
                None => {}
            }
        }
        let audit = &self.commit.audit;
        if audit.rounds > 0 {
            if audit.ok() {
                out.push(format!(
                    "  audit: the {} round(s) landed each of their {} delivered records exactly once",
                    audit.rounds, audit.delivered
                ));
            } else {
                out.push(format!(
                    "  AUDIT FAILED: of {} delivered records, {} missing, {} more than once, {} not delivered by the rounds' batches (`streamtable audit` names the offsets)",
                    audit.delivered, audit.missing, audit.duplicated, audit.unexpected
                ));
            }
            if audit.unreadable > 0 {
                out.push(format!(
                    "  audit: {} file(s) could not be read back, their rows not checked",
                    audit.unreadable
                ));
            }
            for f in &audit.findings {
                out.push(format!("    {f}"));
            }
        }
        let backlog = &self.commit.backlog;
        if backlog.batches > 0 || backlog.more {
            out.push(format!(
                "  backlog: {}{} batches left for the next run",
                backlog.batches,
                if backlog.more { "+" } else { "" }
            ));
        }
        for b in &self.commit.blocked {
            out.push(format!("  blocked: {b}"));
        }
        let (inputs, outputs): (u64, u64) = self
            .compaction
            .iter()
            .fold((0, 0), |(i, o), c| (i + c.input_files, o + c.output_files));
        out.push(format!(
            "compaction: {} partitions, {inputs} files rewritten into {outputs}",
            self.compaction.len()
        ));
        let expired: u64 = self.maintenance.iter().map(|m| m.snapshots_expired).sum();
        let deleted: u64 = self
            .maintenance
            .iter()
            .map(|m| m.files_deleted + m.orphans_deleted)
            .sum();
        out.push(format!(
            "maintenance: {expired} snapshots expired, {deleted} files deleted"
        ));
        let u = &self.units;
        if u.run > 0 {
            out.push(format!(
                "units of work: {} run, at most {} at once: {:.2} s of work in {:.2} s ({:.2} at once on average); the longest {:.0} ms",
                u.run,
                u.concurrency,
                u.busy_ms / 1e3,
                self.duration_ms / 1e3,
                u.busy_ms / self.duration_ms.max(1.0),
                u.longest_ms
            ));
        }
        for f in &self.failures {
            let what = match (&f.table, &f.partition) {
                (Some(t), Some(p)) => format!(" {t} {p}"),
                (Some(t), None) => format!(" {t}"),
                _ => String::new(),
            };
            out.push(format!("failed: {}{what}: {}", f.stage, f.error));
        }
        out
    }
}

/// What the last scheduled run left to fix, as `streamtable tables` shows it: kept in the state
/// store under [`STATUS_KEY`] at the end of every run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct RunStatus {
    /// When the run ended, epoch milliseconds.
    pub finished_at_ms: i64,
    /// Failed steps (the first [`STATUS_LIMIT`]).
    pub failures: Vec<Failure>,
    /// Blocked batches (the first [`STATUS_LIMIT`]).
    pub blocked: Vec<crate::commit::BlockedBatch>,
    /// How many batches were blocked in all.
    pub blocked_total: u64,
    /// What was left for the next run.
    pub backlog: crate::commit::Backlog,
}

/// Key of the [`RunStatus`] in the state store.
pub const STATUS_KEY: &str = "scheduled";
/// Most failures and blocked batches a [`RunStatus`] keeps.
pub const STATUS_LIMIT: usize = 20;
/// Longest message of a failure or blocked batch a [`RunStatus`] keeps, bytes.
pub const STATUS_MESSAGE_BYTES: usize = 4_096;

/// `text` cut to [`STATUS_MESSAGE_BYTES`] (at a character boundary), marked when cut.
fn cut(text: &str) -> String {
    if text.len() <= STATUS_MESSAGE_BYTES {
        return text.to_string();
    }
    let mut end = STATUS_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} bytes; the run's log has it whole)",
        &text[..end],
        text.len()
    )
}

/// The last run's [`RunStatus`], if any run finished.
pub async fn last_run(backend: &Backend) -> Result<Option<RunStatus>> {
    match backend.state.status(STATUS_KEY).await? {
        None => Ok(None),
        Some(json) => serde_json::from_str(&json)
            .map(Some)
            .map_err(|e| Error::Internal(format!("last run's status: {e}"))),
    }
}

/// Runs the stage once, with the default time budget.
pub async fn run(
    backend: &Backend,
    tables: &TableSet,
    options: &ScheduledOptions,
) -> Result<ScheduledReport> {
    run_until(
        backend,
        tables,
        options,
        Instant::now() + DEFAULT_RUN_BUDGET,
    )
    .await
}

/// Runs the stage once; the last step ends by `deadline`. Tables missing from the catalog are
/// created from the spec on first use. Fails only when the state store cannot be reached at
/// all; every other failure is isolated and reported.
pub async fn run_until(
    backend: &Backend,
    tables: &TableSet,
    options: &ScheduledOptions,
    deadline: Instant,
) -> Result<ScheduledReport> {
    let started = Instant::now();
    let (counted, counters) = options.counted();
    let options = &counted;
    let budget = deadline.saturating_duration_since(started);
    let at = |share: f64| started + budget.mul_f64(share);
    let mut report = ScheduledReport {
        state_items_upgraded: backend.state.upgrade(backend.clock.now_ms()).await?,
        ..Default::default()
    };
    // The tables as evolved to the spec: the idle flush below writes with their layouts.
    let mut resolved = crate::ingest::Resolved::default();
    for name in tables.tables.keys() {
        let ensured = tables.ensure(backend, name).await;
        if let Err(e) = &ensured {
            report
                .failures
                .push(Failure::new("commit", Some(name), None, e));
        }
        if let Err(e) = resolved.record(tables, name, ensured) {
            resolved.refused.insert(name.clone(), e.to_string());
        }
    }
    if let Err(e) = tables.ensure_references(backend).await {
        report.failures.push(Failure::new("commit", None, None, &e));
    }
    if let Some(spec) = &tables.windowed_spec {
        // Before the commit, so that the windows it closes land in this run.
        let flushed = match crate::ingest::Ingestor::new(spec, backend) {
            Ok(mut ingestor) => {
                ingestor.use_layouts(&resolved);
                ingestor.flush_idle().await
            }
            Err(e) => Err(e),
        };
        match flushed {
            Ok(idle) => report.idle = idle,
            Err(e) => report.failures.push(Failure::new("idle", None, None, &e)),
        }
    }
    match commit_pending_with(backend, tables, &options.commit, Some(at(COMMIT_SHARE))).await {
        Ok(commit) => {
            // Triggered commits space themselves from this one too.
            if commit.files() > 0
                && let Err(e) =
                    crate::commit::trigger::record_commit(backend, backend.clock.now_ms()).await
            {
                report.failures.push(Failure::new("commit", None, None, &e));
            }
            report.commit = commit
        }
        Err(e) => report.failures.push(Failure::new("commit", None, None, &e)),
    }
    let (compaction, failures) =
        compact_all_until(backend, tables, &options.compaction, at(COMPACT_SHARE)).await;
    report.compaction = compaction;
    report.failures.extend(failures);
    // Expiry must not remove a snapshot a resumable intent still looks for: only after a
    // commit step that left no intent behind.
    let intent_left = backend.state.commit_intent().await?.is_some();
    let (maintenance, failures) = maintain_all_until(
        backend,
        tables,
        &options.maintenance,
        deadline,
        !intent_left,
    )
    .await;
    report.maintenance = maintenance;
    report.failures.extend(failures);
    report.duration_ms = started.elapsed().as_secs_f64() * 1e3;
    report.units = counters.stats(options.concurrency());
    // The status is one item (DynamoDB: at most 400 KB): every message is cut to its first
    // STATUS_MESSAGE_BYTES, so 20 failures and 20 blocked batches always fit.
    let status = RunStatus {
        finished_at_ms: backend.clock.now_ms(),
        failures: report
            .failures
            .iter()
            .take(STATUS_LIMIT)
            .map(|f| Failure {
                error: cut(&f.error),
                ..f.clone()
            })
            .collect(),
        blocked: report
            .commit
            .blocked
            .iter()
            .take(STATUS_LIMIT)
            .map(|b| crate::commit::BlockedBatch {
                reason: cut(&b.reason),
                batch: cut(&b.batch),
                ..b.clone()
            })
            .collect(),
        blocked_total: report.commit.blocked.len() as u64,
        backlog: report.commit.backlog.clone(),
    };
    match serde_json::to_string(&status) {
        Ok(json) => {
            if let Err(e) = backend.state.put_status(STATUS_KEY, &json).await {
                tracing::warn!(error = %e, "could not record the run's status");
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not encode the run's status"),
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_are_cut_so_the_status_item_stays_small() {
        let long = "é".repeat(10_000);
        let c = cut(&long);
        assert!(c.len() < STATUS_MESSAGE_BYTES + 100, "{}", c.len());
        assert!(
            c.ends_with("(20000 bytes; the run's log has it whole)"),
            "{c}"
        );
        assert_eq!(cut("short"), "short");
    }

    #[test]
    fn options_from_the_environment_refuse_a_retention_of_zero_hours() {
        let err = ScheduledOptions::from_lookup(|k| {
            (k == "STREAMTABLE_SNAPSHOT_RETENTION_HOURS").then(|| "0".to_string())
        })
        .expect_err("0 hours would expire snapshots readers are still reading");
        assert!(err.to_string().contains("at least 1"), "{err}");
        let o = ScheduledOptions::from_lookup(|k| match k {
            "STREAMTABLE_SNAPSHOT_RETENTION_HOURS" => Some("2".into()),
            "STREAMTABLE_COMPACT_MIN_FILES" => Some("3".into()),
            "STREAMTABLE_COMMIT_MAX_ROUNDS" => Some("4".into()),
            "STREAMTABLE_COMPACT_TIER_RATIO" => Some("1.5".into()),
            _ => None,
        })
        .expect("valid");
        assert_eq!(o.compaction.tier_ratio, Some(1.5));
        assert_eq!(ScheduledOptions::default().compaction.tier_ratio, Some(2.0));
        let off = ScheduledOptions::from_lookup(|k| {
            (k == "STREAMTABLE_COMPACT_TIER_RATIO").then(|| "off".to_string())
        })
        .expect("off");
        assert_eq!(off.compaction.tier_ratio, None);
        for bad in ["0", "0.5", "-1", "NaN", "inf", "one"] {
            let err = ScheduledOptions::from_lookup(|k| {
                (k == "STREAMTABLE_COMPACT_TIER_RATIO").then(|| bad.to_string())
            })
            .expect_err(bad);
            assert!(
                err.to_string().contains("STREAMTABLE_COMPACT_TIER_RATIO"),
                "{err}"
            );
        }
        assert_eq!(o.maintenance.snapshot_retention_ms, 7_200_000);
        let wide = ScheduledOptions::from_lookup(|k| match k {
            "STREAMTABLE_SCHEDULED_CONCURRENCY" => Some("100000".into()),
            "STREAMTABLE_COMMIT_MAX_ROUND_MB" => Some("8".into()),
            _ => None,
        })
        .expect("valid");
        assert_eq!(wide.concurrency(), MAX_CONCURRENCY, "capped");
        assert_eq!(wide.compaction.runner.concurrency(), MAX_CONCURRENCY);
        assert_eq!(wide.maintenance.runner.concurrency(), MAX_CONCURRENCY);
        assert_eq!(wide.commit.max_round_bytes, 8 * 1024 * 1024);
        for bad in ["0", "-2", "many"] {
            let err = ScheduledOptions::from_lookup(|k| {
                (k == "STREAMTABLE_SCHEDULED_CONCURRENCY").then(|| bad.to_string())
            })
            .expect_err(bad);
            assert!(err.to_string().contains("at least 1"), "{err}");
        }
        assert!(ScheduledOptions::default().concurrency() >= 1);
        assert_eq!(o.compaction.min_input_files, 3);
        assert_eq!(o.commit.max_rounds, 4);
    }
}
