//! The scheduled stage (the compaction Lambda and `streamtable compact`): commit, then
//! compaction, then maintenance. Each step is idempotent and safe to re-run after a crash.

use std::time::Instant;

use serde::Serialize;

use crate::commit::{CommitReport, commit_pending};
use crate::compact::{CompactOptions, PartitionCompaction, compact_all};
use crate::config::Backend;
use crate::error::Result;
use crate::maintenance::{TableMaintenance, maintain_all};
use crate::tables::TableSet;

/// What one scheduled run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScheduledReport {
    pub commit: CommitReport,
    pub compaction: Vec<PartitionCompaction>,
    pub maintenance: Vec<TableMaintenance>,
    pub duration_ms: f64,
}

impl ScheduledReport {
    /// A few lines for humans.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "commit: {} batches, {} files, {} rows in {:.0} ms",
            self.commit.batches,
            self.commit.files(),
            self.commit.rows(),
            self.commit.duration_ms
        )];
        for t in &self.commit.tables {
            out.push(format!(
                "  {:<14} +{} files, +{} rows",
                t.table, t.files, t.rows
            ));
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
        out
    }
}

/// Runs the stage once. Tables missing from the catalog are created from the spec first.
pub async fn run(
    backend: &Backend,
    tables: &TableSet,
    options: &CompactOptions,
) -> Result<ScheduledReport> {
    let started = Instant::now();
    tables.ensure_all(backend).await?;
    let commit = commit_pending(backend, tables).await?;
    let compaction = compact_all(backend, tables, options).await?;
    let maintenance = maintain_all(backend, tables, options).await?;
    Ok(ScheduledReport {
        commit,
        compaction,
        maintenance,
        duration_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}
