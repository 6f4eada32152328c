//! The `replace` commit, built by hand: iceberg-rust 0.10 has no rewrite action.
//!
//! On the current snapshot: one new data manifest per partition spec holding the removed files
//! as `deleted` (with their original sequence numbers), every other live file as `existing`
//! (with its original snapshot id and sequence numbers) and the new files as `added` (taking the
//! new snapshot's sequence number); delete manifests carried unchanged; a manifest list; a
//! `replace` snapshot whose summary totals are the previous totals plus added minus removed;
//! new metadata; then the catalog's compare-and-set. A lost race reloads and rebuilds on the new
//! current snapshot, as long as every file to remove is still live there.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use iceberg::TableIdent;
use iceberg::spec::{
    DataFile, MAIN_BRANCH, ManifestFile, ManifestListWriter, ManifestWriterBuilder, Operation,
    Snapshot, SnapshotReference, SnapshotRetention, SnapshotSummaryCollector, Summary,
};
use iceberg::table::Table;

use super::files::{self, FileEntry, SnapshotFiles};
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
        let metadata = table
            .metadata()
            .clone()
            .into_builder(Some(pointer.metadata_location.clone()))
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
    let ident = table.identifier();
    let ctx = |what: &str| format!("{what} of {ident}");
    let snapshot_id = new_snapshot_id(table);
    let sequence_number = metadata.next_sequence_number();
    let commit = uuid::Uuid::new_v4();
    let schema = metadata.current_schema().clone();
    let mut written = Vec::new();

    // Entries per partition spec.
    let mut by_spec: BTreeMap<i32, Vec<Entry>> = BTreeMap::new();
    let mut summary = SnapshotSummaryCollector::default();
    for FileEntry { spec_id, entry: e } in current.live() {
        let spec_id = *spec_id;
        let kind = if removed.contains(e.file_path()) {
            if let Some(spec) = metadata.partition_spec_by_id(spec_id) {
                summary.remove_file(e.data_file(), schema.clone(), spec.clone());
            }
            Entry::Deleted(e.clone())
        } else {
            Entry::Existing(e.clone())
        };
        by_spec.entry(spec_id).or_default().push(kind);
    }
    // New files are written with the table's default spec.
    let default_spec = metadata.default_partition_spec();
    for f in added {
        summary.add_file(f, schema.clone(), default_spec.clone());
        by_spec
            .entry(default_spec.spec_id())
            .or_default()
            .push(Entry::Added(Box::new(f.clone())));
    }

    let mut manifests: Vec<ManifestFile> = Vec::new();
    for (n, (spec_id, entries)) in by_spec.into_iter().enumerate() {
        let spec = metadata
            .partition_spec_by_id(spec_id)
            .ok_or_else(|| Error::Internal(ctx(&format!("partition spec {spec_id}"))))?;
        let path = format!("{}/metadata/{commit}-m{n}.avro", metadata.location());
        let output = table
            .file_io()
            .new_output(&path)
            .map_err(|e| Error::iceberg(ctx("manifest"), e))?;
        let mut writer = ManifestWriterBuilder::new(
            output,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        )
        .build_v2_data();
        let bad = |e| Error::iceberg(ctx("manifest entry"), e);
        for entry in entries {
            match entry {
                Entry::Existing(e) => writer
                    .add_existing_file(
                        e.data_file().clone(),
                        e.snapshot_id.unwrap_or(snapshot_id),
                        e.sequence_number.unwrap_or(0),
                        e.file_sequence_number.or(e.sequence_number),
                    )
                    .map_err(bad)?,
                Entry::Deleted(e) => writer
                    .add_delete_file(
                        e.data_file().clone(),
                        e.sequence_number.unwrap_or(0),
                        e.file_sequence_number.or(e.sequence_number),
                    )
                    .map_err(bad)?,
                Entry::Added(f) => writer.add_file(*f, -1).map_err(bad)?,
            }
        }
        written.push(path);
        manifests.push(
            writer
                .write_manifest_file()
                .await
                .map_err(|e| Error::iceberg(ctx("write manifest"), e))?,
        );
    }
    // Delete manifests: carried unchanged, unless they hold a delete file the rewrite applied
    // (then rewritten with it marked deleted).
    for (k, m) in current.delete_manifests().enumerate() {
        if removed_deletes.is_empty() {
            manifests.push(m.clone());
            continue;
        }
        let manifest = m
            .load_manifest(table.file_io())
            .await
            .map_err(|e| Error::iceberg(ctx(&format!("manifest {}", m.manifest_path)), e))?;
        let alive: Vec<_> = manifest.entries().iter().filter(|e| e.is_alive()).collect();
        if !alive
            .iter()
            .any(|e| removed_deletes.contains(e.file_path()))
        {
            manifests.push(m.clone());
            continue;
        }
        let spec = metadata
            .partition_spec_by_id(m.partition_spec_id)
            .ok_or_else(|| {
                Error::Internal(ctx(&format!("partition spec {}", m.partition_spec_id)))
            })?;
        let path = format!("{}/metadata/{commit}-d{k}.avro", metadata.location());
        let output = table
            .file_io()
            .new_output(&path)
            .map_err(|e| Error::iceberg(ctx("manifest"), e))?;
        let mut writer = ManifestWriterBuilder::new(
            output,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        )
        .build_v2_deletes();
        let bad = |e| Error::iceberg(ctx("manifest entry"), e);
        for e in alive {
            if removed_deletes.contains(e.file_path()) {
                summary.remove_file(e.data_file(), schema.clone(), spec.clone());
                writer
                    .add_delete_file(
                        e.data_file().clone(),
                        e.sequence_number.unwrap_or(0),
                        e.file_sequence_number.or(e.sequence_number),
                    )
                    .map_err(bad)?;
            } else {
                writer
                    .add_existing_file(
                        e.data_file().clone(),
                        e.snapshot_id.unwrap_or(snapshot_id),
                        e.sequence_number.unwrap_or(0),
                        e.file_sequence_number.or(e.sequence_number),
                    )
                    .map_err(bad)?;
            }
        }
        written.push(path);
        manifests.push(
            writer
                .write_manifest_file()
                .await
                .map_err(|e| Error::iceberg(ctx("write manifest"), e))?,
        );
    }

    let list_path = format!(
        "{}/metadata/snap-{snapshot_id}-0-{commit}.avro",
        metadata.location()
    );
    let list_out = table
        .file_io()
        .new_output(&list_path)
        .map_err(|e| Error::iceberg(ctx("manifest list"), e))?
        .writer()
        .await
        .map_err(|e| Error::iceberg(ctx("manifest list"), e))?;
    let mut list = ManifestListWriter::v2(
        list_out,
        snapshot_id,
        metadata.current_snapshot_id(),
        sequence_number,
    );
    list.add_manifests(manifests.into_iter())
        .map_err(|e| Error::iceberg(ctx("manifest list"), e))?;
    list.close()
        .await
        .map_err(|e| Error::iceberg(ctx("write manifest list"), e))?;
    written.push(list_path.clone());

    let mut props = properties.clone();
    props.extend(summary.build());
    let previous = metadata
        .current_snapshot()
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default();
    add_totals(&mut props, &previous);
    // A join table's state moves only with its join's commits, an upsert table's key index
    // with its upserts: carry them over.
    for key in [
        crate::table::JOIN_STATE_PROPERTY,
        crate::table::KEY_INDEX_PROPERTY,
    ] {
        if let Some(state) = previous.get(key) {
            props
                .entry(key.to_string())
                .or_insert_with(|| state.clone());
        }
    }
    let snapshot = Snapshot::builder()
        .with_manifest_list(list_path)
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(metadata.current_snapshot_id())
        .with_sequence_number(sequence_number)
        .with_summary(Summary {
            operation: Operation::Replace,
            additional_properties: props,
        })
        .with_schema_id(metadata.current_schema_id())
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .build();
    Ok((snapshot, written))
}

enum Entry {
    Existing(iceberg::spec::ManifestEntryRef),
    Deleted(iceberg::spec::ManifestEntryRef),
    Added(Box<DataFile>),
}

/// The six `total-*` fields: previous totals, plus what was added, minus what was removed.
pub(crate) fn add_totals(props: &mut HashMap<String, String>, previous: &HashMap<String, String>) {
    let get = |m: &HashMap<String, String>, k: &str| {
        m.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)
    };
    let totals = [
        ("total-records", "added-records", "deleted-records"),
        ("total-data-files", "added-data-files", "deleted-data-files"),
        ("total-files-size", "added-files-size", "removed-files-size"),
        (
            "total-delete-files",
            "added-delete-files",
            "removed-delete-files",
        ),
        (
            "total-position-deletes",
            "added-position-deletes",
            "removed-position-deletes",
        ),
        (
            "total-equality-deletes",
            "added-equality-deletes",
            "removed-equality-deletes",
        ),
    ];
    let values: Vec<(String, String)> = totals
        .iter()
        .map(|(total, plus, minus)| {
            let v = (get(previous, total) + get(props, plus) - get(props, minus)).max(0);
            (total.to_string(), v.to_string())
        })
        .collect();
    props.extend(values);
}

/// A fresh positive snapshot id not used by the table.
pub(crate) fn new_snapshot_id(table: &Table) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) >> 1) as i64;
        if id != 0 && !table.metadata().snapshots().any(|s| s.snapshot_id() == id) {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_previous_plus_added_minus_removed() {
        let previous: HashMap<String, String> = [
            ("total-records", "100"),
            ("total-data-files", "10"),
            ("total-files-size", "5000"),
            ("total-delete-files", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut props: HashMap<String, String> = [
            ("added-records", "40"),
            ("deleted-records", "40"),
            ("added-data-files", "1"),
            ("deleted-data-files", "4"),
            ("added-files-size", "1500"),
            ("removed-files-size", "2000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        add_totals(&mut props, &previous);
        // A join table's state moves only with its join's commits: carry it over.
        if let Some(state) = previous.get(crate::table::JOIN_STATE_PROPERTY) {
            props
                .entry(crate::table::JOIN_STATE_PROPERTY.to_string())
                .or_insert_with(|| state.clone());
        }
        assert_eq!(props["total-records"], "100");
        assert_eq!(props["total-data-files"], "7");
        assert_eq!(props["total-files-size"], "4500");
        assert_eq!(props["total-delete-files"], "0");
        assert_eq!(props["total-equality-deletes"], "0");
    }
}
