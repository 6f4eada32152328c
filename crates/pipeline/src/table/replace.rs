//! The `replace` commit, built by hand: iceberg-rust 0.10 has no rewrite action.
//!
//! On the current snapshot: one new data manifest per partition spec holding the removed files
//! as `deleted` (with their original sequence numbers), every other live file as `existing`
//! (with its original snapshot id and sequence numbers) and the new files as `added` (taking the
//! new snapshot's sequence number); delete manifests carried unchanged, but for those holding a
//! delete file the rewrite applied (rewritten with it `deleted`); the snapshot itself is built
//! by `table/snapshot.rs`. Then new metadata and the catalog's compare-and-set. A lost race
//! reloads and rebuilds on the new current snapshot, as long as every file to remove is still
//! live there and no delete file the rewrite did not read names one of them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use iceberg::TableIdent;
use iceberg::spec::{
    DataFile, MAIN_BRANCH, ManifestContentType, Operation, Snapshot, SnapshotReference,
    SnapshotRetention,
};
use iceberg::table::Table;

use super::files::{self, FileEntry, SnapshotFiles};
use super::snapshot::{Entry, SnapshotBuild};
use crate::catalog::TableCatalog;
use crate::error::{Error, Result};

pub use super::REPLACE_ID_PROPERTY;

/// How often a lost race is retried.
const MAX_ATTEMPTS: u32 = 8;

/// What a replace commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplaceOutcome {
    /// Committed as this snapshot.
    Committed(i64),
    /// A file to remove is no longer live (another rewrite got there first): nothing committed.
    Stale,
}

/// Replaces `removed` (file paths, all live in the current snapshot) with `added`, in one
/// `replace` snapshot. With both empty it rewrites the manifests only (merging them into one
/// per partition spec).
pub async fn commit_replace(
    catalog: &TableCatalog,
    ident: &TableIdent,
    removed: &HashSet<String>,
    added: &[DataFile],
    properties: &HashMap<String, String>,
) -> Result<ReplaceOutcome> {
    commit_replace_with(
        catalog,
        ident,
        removed,
        &Deletes::default(),
        added,
        properties,
    )
    .await
}

/// The delete files a replace takes into account (a rewrite that applied them).
#[derive(Debug, Clone, Default)]
pub struct Deletes {
    /// Live delete files the rewrite applied to every data file they name, all of which it
    /// removes: removed with them.
    pub removed: HashSet<String>,
    /// The live delete files the rewrite read (`None`: it read none, and the table had none
    /// that named its inputs). A delete file live now and not among them names rows the
    /// rewrite kept: the replace is stale.
    pub seen: Option<HashSet<String>>,
}

/// [`commit_replace`] for a rewrite that applied delete files.
pub async fn commit_replace_with(
    catalog: &TableCatalog,
    ident: &TableIdent,
    removed: &HashSet<String>,
    deletes: &Deletes,
    added: &[DataFile],
    properties: &HashMap<String, String>,
) -> Result<ReplaceOutcome> {
    commit_replace_setting(catalog, ident, removed, deletes, added, properties, &|_| {
        Vec::new()
    })
    .await
}

/// [`commit_replace_with`], setting in the same metadata commit the table properties
/// `table_properties` gives for the table the replace builds on (what an upsert table counts
/// of the rows a rewrite dropped).
pub async fn commit_replace_setting(
    catalog: &TableCatalog,
    ident: &TableIdent,
    removed: &HashSet<String>,
    deletes: &Deletes,
    added: &[DataFile],
    properties: &HashMap<String, String>,
    table_properties: &(dyn Fn(&Table) -> Vec<(String, String)> + Sync),
) -> Result<ReplaceOutcome> {
    // Carried by the snapshot, so that an attempt whose outcome was unknown is recognised.
    let replace_id = uuid::Uuid::new_v4().to_string();
    let mut properties = properties.clone();
    properties.insert(REPLACE_ID_PROPERTY.to_string(), replace_id.clone());
    let mut last_unknown = None;
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(20 << attempt.min(6))).await;
        }
        let (table, pointer) = catalog
            .load(ident)
            .await?
            .ok_or_else(|| Error::Config(format!("table {ident} does not exist")))?;
        if let Some(id) = snapshot_with(&table, REPLACE_ID_PROPERTY, &replace_id) {
            return Ok(ReplaceOutcome::Committed(id));
        }
        let Some(current) = table.metadata().current_snapshot().cloned() else {
            return Ok(ReplaceOutcome::Stale);
        };
        let snapshot_files = files::load(&table, &current).await?;
        let live: HashSet<&str> = snapshot_files.live().map(|e| e.entry.file_path()).collect();
        if !removed.iter().all(|p| live.contains(p.as_str())) {
            return Ok(ReplaceOutcome::Stale);
        }
        let live_deletes = files::live_delete_files(&table, &snapshot_files).await?;
        let deletes_now: HashSet<&str> = live_deletes.iter().map(|e| e.entry.file_path()).collect();
        // Delete files the rewrite did not read: stale only if one names a row of its inputs.
        let unread: Vec<FileEntry> = live_deletes
            .iter()
            .filter(|e| {
                deletes
                    .seen
                    .as_ref()
                    .is_none_or(|seen| !seen.contains(e.entry.file_path()))
            })
            .cloned()
            .collect();
        let unseen = !unread.is_empty() && deletes_touch(&table, &unread, removed).await?;
        if unseen
            || !deletes
                .removed
                .iter()
                .all(|p| deletes_now.contains(p.as_str()))
        {
            // Rows of the inputs were deleted after the rewrite read them (or a delete file
            // it applied is gone): committing would bring them back.
            return Ok(ReplaceOutcome::Stale);
        }
        added_files_exist(&table, ident, added).await?;
        let (snapshot, written) = build_snapshot(
            &table,
            &snapshot_files,
            removed,
            &deletes.removed,
            added,
            &properties,
        )
        .await?;
        let snapshot_id = snapshot.snapshot_id();
        let set: HashMap<String, String> = table_properties(&table).into_iter().collect();
        let mut builder = table
            .metadata()
            .clone()
            .into_builder(Some(pointer.metadata_location.clone()));
        if !set.is_empty() {
            builder = builder
                .set_properties(set)
                .map_err(|e| Error::iceberg(format!("replace metadata of {ident}"), e))?;
        }
        let metadata = builder
            .add_snapshot(snapshot)
            .and_then(|b| {
                b.set_ref(
                    MAIN_BRANCH,
                    SnapshotReference::new(
                        snapshot_id,
                        SnapshotRetention::branch(None, None, None),
                    ),
                )
            })
            .and_then(|b| b.build())
            .map_err(|e| Error::iceberg(format!("replace metadata of {ident}"), e))?
            .metadata;
        match catalog.commit_metadata(&table, &pointer, metadata).await {
            Ok(Some(_)) => return Ok(ReplaceOutcome::Committed(snapshot_id)),
            Ok(None) => {
                tracing::info!(table = %ident, attempt, "replace lost a race; rebuilding on the new snapshot");
                for path in written {
                    let _ = table.file_io().delete(&path).await;
                }
            }
            // Maybe committed: keep what it wrote (orphan clean-up decides later) and look
            // again; the next attempt recognises the snapshot by its replace id.
            Err(e @ Error::CommitStateUnknown { .. }) => {
                tracing::warn!(table = %ident, attempt, error = %e, "replace outcome unknown; checking again");
                last_unknown = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_unknown.unwrap_or(Error::CommitContention {
        table: ident.to_string(),
        attempts: MAX_ATTEMPTS,
    }))
}

/// Every file a replace adds is still there: a snapshot naming a missing file fails every
/// reader, and the files a rewrite wrote are unknown to the catalog until it commits — orphan
/// clean-up of a run that outlasted its grace period could have deleted them.
async fn added_files_exist(table: &Table, ident: &TableIdent, added: &[DataFile]) -> Result<()> {
    for f in added {
        let path = f.file_path();
        let there = table.file_io().exists(path).await.map_err(|e| {
            Error::iceberg(format!("check {path} before the replace of {ident}"), e)
        })?;
        if !there {
            return Err(Error::ObjectStore {
                op: "check before replace",
                location: path.to_string(),
                message: format!(
                    "a file written for a replace of {ident} is gone before its commit (orphan clean-up deletes unreferenced files older than orphan_grace: keep it longer than a compaction takes); nothing committed, the next run rewrites again"
                ),
                retryable: true,
            });
        }
    }
    Ok(())
}

/// Whether any of `deletes` (live delete files) may name a row of a file in `removed`: an
/// equality delete may name any; a position delete is read.
async fn deletes_touch(
    table: &Table,
    deletes: &[FileEntry],
    removed: &HashSet<String>,
) -> Result<bool> {
    for d in deletes {
        if d.entry.content_type() != iceberg::spec::DataContentType::PositionDeletes {
            return Ok(true);
        }
        let rows = crate::upsert::read::position_deletes(
            table,
            d.entry.file_path(),
            d.entry.file_size_in_bytes(),
        )
        .await?;
        if rows.iter().any(|(p, _)| removed.contains(p)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The id of the snapshot in the table's history whose summary has `key` = `value`.
pub fn snapshot_with(table: &Table, key: &str, value: &str) -> Option<i64> {
    table
        .metadata()
        .snapshots()
        .find(|s| {
            s.summary()
                .additional_properties
                .get(key)
                .map(String::as_str)
                == Some(value)
        })
        .map(|s| s.snapshot_id())
}

/// Writes the manifests and manifest list of the replace snapshot; returns the snapshot and the
/// paths written (to delete if the commit loses).
async fn build_snapshot(
    table: &Table,
    current: &SnapshotFiles,
    removed: &HashSet<String>,
    removed_deletes: &HashSet<String>,
    added: &[DataFile],
    properties: &HashMap<String, String>,
) -> Result<(Snapshot, Vec<String>)> {
    let metadata = table.metadata();
    let mut build = SnapshotBuild::new(table);

    // Data entries per partition spec; new files are written with the table's default spec.
    let mut by_spec: BTreeMap<i32, Vec<Entry>> = BTreeMap::new();
    for FileEntry { spec_id, entry: e } in current.live() {
        let kind = if removed.contains(e.file_path()) {
            Entry::Deleted(e.clone())
        } else {
            Entry::Existing(e.clone())
        };
        by_spec.entry(*spec_id).or_default().push(kind);
    }
    for f in added {
        by_spec
            .entry(metadata.default_partition_spec_id())
            .or_default()
            .push(Entry::Added(Box::new(f.clone())));
    }
    for (spec_id, entries) in by_spec {
        build
            .manifest(spec_id, ManifestContentType::Data, entries)
            .await?;
    }
    // Delete manifests: carried unchanged, unless they hold a delete file the rewrite applied
    // (then rewritten with it marked deleted).
    for m in current.delete_manifests() {
        if removed_deletes.is_empty() {
            build.carry(m.clone());
            continue;
        }
        let manifest = m.load_manifest(table.file_io()).await.map_err(|e| {
            Error::iceberg(
                format!("manifest {} of {}", m.manifest_path, table.identifier()),
                e,
            )
        })?;
        let alive: Vec<_> = manifest.entries().iter().filter(|e| e.is_alive()).collect();
        if !alive
            .iter()
            .any(|e| removed_deletes.contains(e.file_path()))
        {
            build.carry(m.clone());
            continue;
        }
        let entries = alive
            .into_iter()
            .map(|e| {
                if removed_deletes.contains(e.file_path()) {
                    Entry::Deleted(e.clone())
                } else {
                    Entry::Existing(e.clone())
                }
            })
            .collect();
        build
            .manifest(m.partition_spec_id, ManifestContentType::Deletes, entries)
            .await?;
    }
    build.finish(Operation::Replace, properties).await
}
