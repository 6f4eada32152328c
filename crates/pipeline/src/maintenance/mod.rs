//! Maintenance: expire old snapshots and delete what nothing references any more.
//!
//! - Expiry keeps the last N snapshots and every snapshot younger than the retention period
//!   (Iceberg's `expire_snapshots`, metadata only), then deletes the manifest lists, manifests
//!   and data files that only the expired snapshots referenced.
//! - Orphan clean-up deletes files under a table's location that no snapshot, no metadata log
//!   entry and no pending batch references, once they are older than a grace period: the files
//!   of crashed or losing invocations, and of lost commit races. References are read after the
//!   listing, an ingest file is only a candidate once its partition's checkpoint has passed its
//!   last offset (no retry can register it any more), and each object's age is looked at again
//!   right before it is deleted.
//! - Manifest merge rewrites the current snapshot's manifests into one per partition spec when
//!   there are too many (every commit adds one).
//!
//! Nothing a retained snapshot or a pending batch references is ever deleted.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use iceberg::spec::SnapshotRef;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use serde::Serialize;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::failure::Failure;
use crate::table::files;
use crate::table::replace::{ReplaceOutcome, commit_replace};
use crate::tables::TableSet;

/// Knobs of maintenance. `Default` gives the documented defaults.
#[derive(Debug, Clone)]
pub struct MaintenanceOptions {
    /// Snapshots kept whatever their age.
    pub keep_last_snapshots: usize,
    /// Snapshots younger than this are kept (milliseconds).
    pub snapshot_retention_ms: i64,
    /// Files no snapshot or pending batch references are deleted once older than this.
    pub orphan_grace_ms: i64,
    /// Merge the current snapshot's manifests when there are more than this many.
    pub max_manifests: usize,
    /// Runs the tables' maintenance in parallel.
    pub runner: crate::scheduled::runner::Runner,
}

impl Default for MaintenanceOptions {
    fn default() -> Self {
        MaintenanceOptions {
            keep_last_snapshots: crate::table::properties::DEFAULT_KEEP_LAST_SNAPSHOTS,
            snapshot_retention_ms: crate::table::properties::DEFAULT_SNAPSHOT_RETENTION_MS,
            orphan_grace_ms: 24 * 3600 * 1000,
            max_manifests: 100,
            runner: crate::scheduled::runner::Runner::per_core(),
        }
    }
}

/// What maintenance did to one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableMaintenance {
    /// The table.
    pub table: String,
    /// Snapshots expired.
    pub snapshots_expired: u64,
    /// Files only expired snapshots referenced, deleted.
    pub files_deleted: u64,
    /// Files nothing referenced, deleted.
    pub orphans_deleted: u64,
    /// Manifests merged into one per partition spec.
    pub manifests_merged: u64,
}

mod orphans;
mod properties;

#[cfg(feature = "sql")]
use orphans::remove_join_states;
use orphans::{remove_orphans, remove_partition_states, remove_spilled_lists};
pub use properties::{retention_properties, sync_retention};

/// Runs maintenance on every table; the first failure is returned (see
/// [`maintain_all_until`] for the scheduled stage's isolated form).
pub async fn maintain_all(
    backend: &Backend,
    tables: &TableSet,
    options: &MaintenanceOptions,
) -> Result<Vec<TableMaintenance>> {
    let far = Instant::now() + std::time::Duration::from_secs(24 * 3600);
    let (done, failures) = maintain_all_until(backend, tables, options, far, true).await;
    match failures.into_iter().next() {
        Some(f) => Err(Error::Internal(format!(
            "maintenance of {} failed: {}",
            f.table.unwrap_or_default(),
            f.error
        ))),
        None => Ok(done),
    }
}

/// Runs maintenance on every table until `deadline` (a table is not started after it), then
/// removes spilled pending-file lists no batch needs. Snapshots are expired only when `expire`
/// (no commit intent is left that may still look for its snapshot). A table that fails is
/// reported and the others go on.
pub async fn maintain_all_until(
    backend: &Backend,
    tables: &TableSet,
    options: &MaintenanceOptions,
    deadline: Instant,
    expire: bool,
) -> (Vec<TableMaintenance>, Vec<Failure>) {
    let mut out = Vec::new();
    let mut failures = Vec::new();
    // Files an interval join's backlog still has to read: compaction may have replaced them,
    // but neither expiry nor orphan clean-up deletes them while the backlog names them.
    let waiting = match join_backlogs(backend, tables).await {
        Ok(w) => w,
        Err((name, e)) => {
            // Without knowing what the backlog names, nothing may be deleted this run.
            failures.push(Failure::new("maintenance", Some(&name), None, &e));
            return (out, failures);
        }
    };
    // Units: one per table, in parallel; a unit that starts past the deadline does nothing.
    let waiting = std::sync::Arc::new(waiting);
    let names: Vec<String> = tables.tables.keys().cloned().collect();
    let results = options
        .runner
        .run(names.clone(), |name| {
            let (backend, options, waiting) = (backend.clone(), options.clone(), waiting.clone());
            let ident = tables.ident(&name);
            async move {
                if Instant::now() >= deadline {
                    tracing::info!(table = %name, "maintenance time of this run used up; the rest waits for the next run");
                    return Ok(None);
                }
                let mut report = TableMaintenance {
                    table: name.clone(),
                    ..Default::default()
                };
                if backend.catalog.load(&ident).await?.is_none() {
                    return Ok(None);
                }
                sync_retention(&backend, &ident, &options).await?;
                merge_manifests(&backend, &ident, &options, &mut report).await?;
                if expire {
                    expire_snapshots(
                        &backend,
                        &ident,
                        &options,
                        backend.clock.now_ms(),
                        &waiting,
                        &mut report,
                    )
                    .await?;
                }
                remove_orphans(&backend, &ident, &options, &waiting, &mut report).await?;
                Ok::<_, Error>(Some(report))
            }
        })
        .await;
    for (name, result) in names.into_iter().zip(results) {
        match result {
            Ok(Ok(Some(report))) => out.push(report),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => failures.push(Failure::new("maintenance", Some(&name), None, &e)),
            Err(panic) => failures.push(Failure::new(
                "maintenance",
                Some(&name),
                None,
                &Error::Internal(panic.to_string()),
            )),
        }
    }
    if let Err(e) = remove_spilled_lists(backend, options).await {
        failures.push(Failure::new("maintenance", None, None, &e));
    }
    for removed in [
        remove_partition_states(backend, tables, options).await,
        #[cfg(feature = "sql")]
        remove_join_states(backend, tables, options).await,
    ] {
        match removed {
            Ok(0) => {}
            Ok(n) => tracing::info!(objects = n, "orphaned state objects deleted"),
            Err(e) => failures.push(Failure::new("maintenance", None, None, &e)),
        }
    }
    (out, failures)
}

/// The data files every interval join's backlog names, or the join whose backlog could not be
/// read.
async fn join_backlogs(
    backend: &Backend,
    tables: &TableSet,
) -> std::result::Result<HashSet<String>, (String, Error)> {
    #[cfg_attr(not(feature = "sql"), allow(unused_mut))]
    let mut waiting = HashSet::new();
    #[cfg(feature = "sql")]
    for (name, _) in &tables.joins {
        let files = async {
            match backend.catalog.load(&tables.ident(name)).await? {
                Some((t, _)) => crate::commit::join::backlog_files(backend, &t, name).await,
                None => Ok(Vec::new()),
            }
        };
        waiting.extend(files.await.map_err(|e| (name.clone(), e))?);
    }
    #[cfg(not(feature = "sql"))]
    let _ = (backend, tables);
    Ok(waiting)
}

async fn merge_manifests(
    backend: &Backend,
    ident: &iceberg::TableIdent,
    options: &MaintenanceOptions,
    report: &mut TableMaintenance,
) -> Result<()> {
    let Some((table, _)) = backend.catalog.load(ident).await? else {
        return Ok(());
    };
    let Some(current) = table.metadata().current_snapshot() else {
        return Ok(());
    };
    let list = table
        .manifest_list_reader(current)
        .load()
        .await
        .map_err(|e| Error::iceberg(format!("manifest list of {ident}"), e))?;
    let count = list.entries().len();
    if count <= options.max_manifests {
        return Ok(());
    }
    let props = HashMap::from([(
        "streamtable.operation".to_string(),
        "merge-manifests".to_string(),
    )]);
    if let ReplaceOutcome::Committed(_) =
        commit_replace(&backend.catalog, ident, &HashSet::new(), &[], &props).await?
    {
        report.manifests_merged = count as u64;
    }
    Ok(())
}

/// Paths a set of snapshots references: manifest lists, manifests, and every file their
/// manifests mention (whatever the entry status).
pub(crate) async fn referenced(
    table: &Table,
    snapshots: &[SnapshotRef],
) -> Result<HashSet<String>> {
    let mut paths = HashSet::new();
    let mut seen_manifests = HashSet::new();
    for s in snapshots {
        paths.insert(s.manifest_list().to_string());
        // An upsert table's key index is named by the snapshot's summary: its newest run and
        // the runs before it.
        let summary = &s.summary().additional_properties;
        if let Some(index) = summary.get(crate::table::KEY_INDEX_PROPERTY) {
            paths.insert(index.clone());
            let runs = summary.get(crate::table::KEY_INDEX_RUNS_PROPERTY);
            if let Some((dir, runs)) =
                crate::upsert::index::named_runs(index, runs.map(String::as_str))
            {
                paths.extend(runs.into_iter().map(|r| format!("{dir}/{}", r.name)));
            }
        }
        let list = table
            .manifest_list_reader(s)
            .load()
            .await
            .map_err(|e| Error::iceberg(format!("manifest list {}", s.manifest_list()), e))?;
        for m in list.entries() {
            paths.insert(m.manifest_path.clone());
            if !seen_manifests.insert(m.manifest_path.clone()) {
                continue;
            }
            let manifest = m
                .load_manifest(table.file_io())
                .await
                .map_err(|e| Error::iceberg(format!("manifest {}", m.manifest_path), e))?;
            for e in manifest.entries() {
                paths.insert(e.file_path().to_string());
            }
        }
    }
    Ok(paths)
}

async fn expire_snapshots(
    backend: &Backend,
    ident: &iceberg::TableIdent,
    options: &MaintenanceOptions,
    now: i64,
    waiting: &HashSet<String>,
    report: &mut TableMaintenance,
) -> Result<()> {
    let Some((table, _)) = backend.catalog.load(ident).await? else {
        return Ok(());
    };
    let cutoff = now - options.snapshot_retention_ms;
    let mut snapshots: Vec<SnapshotRef> = table.metadata().snapshots().cloned().collect();
    snapshots.sort_by_key(|s| std::cmp::Reverse(s.sequence_number()));
    let expirable = snapshots
        .iter()
        .skip(options.keep_last_snapshots.max(1))
        .filter(|s| s.timestamp_ms() < cutoff)
        .count();
    if expirable == 0 {
        return Ok(());
    }
    let before = referenced(&table, &snapshots).await?;
    let tx = Transaction::new(&table);
    let action = tx
        .expire_snapshots()
        .expire_older_than_ms(cutoff)
        .retain_last(options.keep_last_snapshots.max(1));
    let tx = action
        .apply(tx)
        .map_err(|e| Error::iceberg(format!("expire snapshots of {ident}"), e))?;
    let table = tx
        .commit(&backend.catalog)
        .await
        .map_err(|e| Error::iceberg(format!("expire snapshots of {ident}"), e))?;
    let retained: Vec<SnapshotRef> = table.metadata().snapshots().cloned().collect();
    report.snapshots_expired = (snapshots.len() - retained.len()) as u64;
    let after = referenced(&table, &retained).await?;
    let doomed: Vec<&String> = before
        .difference(&after)
        .filter(|p| !waiting.contains(*p))
        .collect();
    for path in &doomed {
        backend.warehouse.delete(path).await?;
    }
    report.files_deleted = doomed.len() as u64;
    tracing::info!(table = %ident, expired = report.snapshots_expired, deleted = report.files_deleted, "expired snapshots");
    Ok(())
}

/// Live data files of the current snapshot (for tools and tests).
pub async fn live_files(table: &Table) -> Result<Vec<String>> {
    Ok(files::load_current(table)
        .await?
        .live()
        .map(|e| e.entry.file_path().to_string())
        .collect())
}
