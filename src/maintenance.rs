//! Maintenance: expire old snapshots and delete what nothing references any more.
//!
//! - Expiry keeps the last N snapshots and every snapshot younger than the retention period
//!   (Iceberg's `expire_snapshots`, metadata only), then deletes the manifest lists, manifests
//!   and data files that only the expired snapshots referenced.
//! - Orphan clean-up deletes files under a table's location that no snapshot, no metadata log
//!   entry and no pending batch references, once they are older than a grace period: the files
//!   of crashed or losing invocations, and of lost commit races.
//! - Manifest merge rewrites the current snapshot's manifests into one per partition spec when
//!   there are too many (every commit adds one).
//!
//! Nothing a retained snapshot or a pending batch references is ever deleted.

use std::collections::{HashMap, HashSet};

use iceberg::spec::SnapshotRef;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use serde::Serialize;

use crate::commit::resolve_files;
use crate::compact::replace::{ReplaceOutcome, commit_replace};
use crate::compact::{CompactOptions, files};
use crate::config::Backend;
use crate::error::{Error, Result};
use crate::tables::TableSet;

/// What maintenance did to one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableMaintenance {
    pub table: String,
    pub snapshots_expired: u64,
    pub files_deleted: u64,
    pub orphans_deleted: u64,
    pub manifests_merged: u64,
}

/// Runs maintenance on every table, then removes stale spilled pending-file lists.
pub async fn maintain_all(
    backend: &Backend,
    tables: &TableSet,
    options: &CompactOptions,
) -> Result<Vec<TableMaintenance>> {
    let now = crate::commit::now_ms();
    // Everything pending batches reference, read once.
    let mut pending_paths: HashSet<String> = HashSet::new();
    let mut pending_lists: HashSet<String> = HashSet::new();
    for batch in backend.state.pending().await? {
        if let Some(l) = &batch.files_location {
            pending_lists.insert(l.clone());
        }
        for f in resolve_files(backend, &batch).await? {
            let df: serde_json::Value = serde_json::from_str(&f.data_file).unwrap_or_default();
            if let Some(p) = df.get("file_path").and_then(|v| v.as_str()) {
                pending_paths.insert(p.to_string());
            }
        }
    }
    let mut out = Vec::new();
    for name in tables.tables.keys() {
        let ident = tables.ident(name);
        if backend.catalog.load(&ident).await?.is_none() {
            continue;
        }
        let mut report = TableMaintenance {
            table: name.clone(),
            ..Default::default()
        };
        merge_manifests(backend, &ident, options, &mut report).await?;
        expire(backend, &ident, options, now, &mut report).await?;
        remove_orphans(backend, &ident, options, now, &pending_paths, &mut report).await?;
        out.push(report);
    }
    // Spilled file lists of batches that were committed.
    let root = format!("{}/_pending/", backend.warehouse.root());
    for o in backend.warehouse.list(&root).await? {
        if !pending_lists.contains(&o.location) && now - o.modified_ms > options.orphan_grace_ms {
            backend.warehouse.delete(&o.location).await?;
        }
    }
    Ok(out)
}

async fn merge_manifests(
    backend: &Backend,
    ident: &iceberg::TableIdent,
    options: &CompactOptions,
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
async fn referenced(table: &Table, snapshots: &[SnapshotRef]) -> Result<HashSet<String>> {
    let mut paths = HashSet::new();
    let mut seen_manifests = HashSet::new();
    for s in snapshots {
        paths.insert(s.manifest_list().to_string());
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

async fn expire(
    backend: &Backend,
    ident: &iceberg::TableIdent,
    options: &CompactOptions,
    now: i64,
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
    let doomed: Vec<&String> = before.difference(&after).collect();
    for path in &doomed {
        backend.warehouse.delete(path).await?;
    }
    report.files_deleted = doomed.len() as u64;
    tracing::info!(table = %ident, expired = report.snapshots_expired, deleted = report.files_deleted, "expired snapshots");
    Ok(())
}

async fn remove_orphans(
    backend: &Backend,
    ident: &iceberg::TableIdent,
    options: &CompactOptions,
    now: i64,
    pending: &HashSet<String>,
    report: &mut TableMaintenance,
) -> Result<()> {
    let Some((table, pointer)) = backend.catalog.load(ident).await? else {
        return Ok(());
    };
    let location = table
        .metadata()
        .location()
        .trim_end_matches('/')
        .to_string();
    let objects = backend.warehouse.list(&format!("{location}/")).await?;
    let old: Vec<_> = objects
        .into_iter()
        .filter(|o| now - o.modified_ms > options.orphan_grace_ms)
        .collect();
    if old.is_empty() {
        return Ok(());
    }
    let snapshots: Vec<SnapshotRef> = table.metadata().snapshots().cloned().collect();
    let mut keep = referenced(&table, &snapshots).await?;
    keep.insert(pointer.metadata_location.clone());
    keep.extend(
        table
            .metadata()
            .metadata_log()
            .iter()
            .map(|m| m.metadata_file.clone()),
    );
    for o in old {
        if keep.contains(&o.location) || pending.contains(&o.location) {
            continue;
        }
        backend.warehouse.delete(&o.location).await?;
        report.orphans_deleted += 1;
    }
    if report.orphans_deleted > 0 {
        tracing::info!(table = %ident, orphans = report.orphans_deleted, "removed orphan files");
    }
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
