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

use crate::checkpoint::SourcePartition;
use crate::commit::resolve_files;
use crate::compact::replace::{ReplaceOutcome, commit_replace};
use crate::compact::{CompactOptions, files};
use crate::config::Backend;
use crate::error::{Error, Result};
use crate::scheduled::Failure;
use crate::storage::ObjectInfo;
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

/// Runs maintenance on every table; the first failure is returned (see
/// [`maintain_all_until`] for the scheduled stage's isolated form).
pub async fn maintain_all(
    backend: &Backend,
    tables: &TableSet,
    options: &CompactOptions,
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
    options: &CompactOptions,
    deadline: Instant,
    expire: bool,
) -> (Vec<TableMaintenance>, Vec<Failure>) {
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for name in tables.tables.keys() {
        if Instant::now() >= deadline {
            tracing::info!("maintenance time of this run used up; the rest waits for the next run");
            break;
        }
        let ident = tables.ident(name);
        let mut report = TableMaintenance {
            table: name.clone(),
            ..Default::default()
        };
        let done = async {
            if backend.catalog.load(&ident).await?.is_none() {
                return Ok(false);
            }
            merge_manifests(backend, &ident, options, &mut report).await?;
            if expire {
                expire_snapshots(backend, &ident, options, backend.clock.now_ms(), &mut report).await?;
            }
            remove_orphans(backend, &ident, options, &mut report).await?;
            Ok::<_, Error>(true)
        };
        match done.await {
            Ok(true) => out.push(report),
            Ok(false) => {}
            Err(e) => failures.push(Failure::new("maintenance", Some(name), None, &e)),
        }
    }
    if let Err(e) = remove_spilled_lists(backend, options).await {
        failures.push(Failure::new("maintenance", None, None, &e));
    }
    (out, failures)
}

/// Spilled file lists (`_pending/…`) of batches that were committed.
async fn remove_spilled_lists(backend: &Backend, options: &CompactOptions) -> Result<()> {
    let root = format!("{}/_pending/", backend.warehouse.root());
    let candidates = old_objects(backend, &root, options).await?;
    if candidates.is_empty() {
        return Ok(());
    }
    let mut guard = References::read(backend).await?;
    let names: Vec<&str> = candidates.iter().map(|o| o.location.as_str()).collect();
    guard.read_checkpoints(backend, &names).await?;
    for o in candidates {
        if guard.may_be_needed(&o.location) {
            continue;
        }
        delete_if_still_old(backend, &o.location, options).await?;
    }
    Ok(())
}

/// Objects under `prefix` older than the grace period.
async fn old_objects(
    backend: &Backend,
    prefix: &str,
    options: &CompactOptions,
) -> Result<Vec<ObjectInfo>> {
    let now = backend.clock.now_ms();
    Ok(backend
        .warehouse
        .list(prefix)
        .await?
        .into_iter()
        .filter(|o| now - o.modified_ms > options.orphan_grace_ms)
        .collect())
}

/// Deletes an orphan candidate after looking at it once more: an object rewritten since it was
/// listed (a retry re-uploading a file of the same content) is younger now, and stays.
async fn delete_if_still_old(
    backend: &Backend,
    location: &str,
    options: &CompactOptions,
) -> Result<bool> {
    match backend.warehouse.stat(location).await? {
        Some(o) if backend.clock.now_ms() - o.modified_ms > options.orphan_grace_ms => {
            backend.warehouse.delete(location).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// What ingest may still reference, read *after* the candidates were listed (so that a file a
/// retry re-uploads and registers in between is seen): the files of every pending batch, and
/// the checkpoints of the partitions whose files are candidates.
struct References {
    pending_files: HashSet<String>,
    pending_lists: HashSet<String>,
    next_offsets: HashMap<SourcePartition, i64>,
}

impl References {
    async fn read(backend: &Backend) -> Result<References> {
        let mut refs = References {
            pending_files: HashSet::new(),
            pending_lists: HashSet::new(),
            next_offsets: HashMap::new(),
        };
        for batch in backend.state.pending().await? {
            if let Some(l) = &batch.files_location {
                refs.pending_lists.insert(l.clone());
            }
            for f in resolve_files(backend, &batch).await? {
                let df: serde_json::Value = serde_json::from_str(&f.data_file).unwrap_or_default();
                if let Some(p) = df.get("file_path").and_then(|v| v.as_str()) {
                    refs.pending_files.insert(p.to_string());
                }
            }
        }
        Ok(refs)
    }

    /// Reads the checkpoints of the partitions named by ingest files among `locations`.
    async fn read_checkpoints(&mut self, backend: &Backend, locations: &[&str]) -> Result<()> {
        for loc in locations {
            if let IngestName::Of(source, _) = ingest_name(loc)
                && !self.next_offsets.contains_key(&source)
            {
                let cp = backend.state.checkpoint(&source).await?;
                self.next_offsets.insert(source, cp.next_offset);
            }
        }
        Ok(())
    }

    /// Whether ingest references the object, or may still: a pending batch names it, or it is
    /// an ingest file of offsets a retry could still deliver (at or past the checkpoint, or of
    /// a partition it cannot tell).
    fn may_be_needed(&self, location: &str) -> bool {
        if self.pending_files.contains(location) || self.pending_lists.contains(location) {
            return true;
        }
        match ingest_name(location) {
            IngestName::Of(source, last) => self
                .next_offsets
                .get(&source)
                .is_none_or(|next| *next <= last),
            IngestName::OfUnknownPartition => true,
            IngestName::Other => false,
        }
    }
}

/// What an object's name says about the ingest batch that wrote it.
#[derive(Debug, PartialEq, Eq)]
enum IngestName {
    /// An ingest file or spilled list of this topic-partition, up to this offset.
    Of(SourcePartition, i64),
    /// An ingest file whose topic was shortened in its name.
    OfUnknownPartition,
    /// Not named by ingest (compaction outputs, metadata).
    Other,
}

/// Reads `{topic}-{partition}-{first}-{last}-{seq}-{hash}.parquet` and
/// `_pending/{topic}/{partition}/{first}-{last}-{hash}.json`.
fn ingest_name(location: &str) -> IngestName {
    let parsed = || -> Option<(&str, &str, &str)> {
        let name = location.rsplit('/').next()?;
        if let Some(stem) = name.strip_suffix(".parquet") {
            let mut parts = stem.rsplitn(6, '-');
            let (hash, seq, last, first, partition, topic) = (
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
            );
            let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
            if hash.len() != 16 || !digits(seq, 3) || !digits(first, 20) || !digits(last, 20) {
                return None;
            }
            return Some((topic, partition, last));
        }
        let stem = name.strip_suffix(".json")?;
        let mut dirs = location.rsplit('/').skip(1);
        let partition = dirs.next()?;
        let topic = dirs.next()?;
        if dirs.next()? != "_pending" {
            return None;
        }
        Some((topic, partition, stem.split('-').nth(1)?))
    };
    let Some((topic, partition, last)) = parsed() else {
        return IngestName::Other;
    };
    match (
        crate::partition::topic_from_name(topic),
        partition.parse::<i32>(),
        last.parse::<i64>(),
    ) {
        (Some(topic), Ok(partition), Ok(last)) => {
            IngestName::Of(SourcePartition::new(topic, partition), last)
        }
        _ => IngestName::OfUnknownPartition,
    }
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

async fn expire_snapshots(
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
    report: &mut TableMaintenance,
) -> Result<()> {
    let Some((table, _)) = backend.catalog.load(ident).await? else {
        return Ok(());
    };
    let location = table
        .metadata()
        .location()
        .trim_end_matches('/')
        .to_string();
    let old = old_objects(backend, &format!("{location}/"), options).await?;
    if old.is_empty() {
        return Ok(());
    }
    // Everything below is read after the listing: a file written or registered since is seen.
    let mut guard = References::read(backend).await?;
    let names: Vec<&str> = old.iter().map(|o| o.location.as_str()).collect();
    guard.read_checkpoints(backend, &names).await?;
    let Some((table, pointer)) = backend.catalog.load(ident).await? else {
        return Ok(());
    };
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
        if keep.contains(&o.location) || guard.may_be_needed(&o.location) {
            continue;
        }
        if delete_if_still_old(backend, &o.location, options).await? {
            report.orphans_deleted += 1;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingest_names_tell_their_partition_or_keep_the_file() {
        let f = "/w/ns.db/orders/data/d=1/orders.v2-3-00000000000000000010-00000000000000000019-000-0123456789abcdef.parquet";
        assert_eq!(
            ingest_name(f),
            IngestName::Of(SourcePartition::new("orders.v2", 3), 19)
        );
        let spilled =
            "/w/_pending/a%2Fb/0/00000000000000000001-00000000000000000002-0123456789abcdef.json";
        assert_eq!(
            ingest_name(spilled),
            IngestName::Of(SourcePartition::new("a/b", 0), 2)
        );
        let long = format!(
            "/w/ns.db/t/data/{}-0-00000000000000000000-00000000000000000002-000-0123456789abcdef.parquet",
            crate::partition::topic_in_name(&"t".repeat(249))
        );
        assert_eq!(ingest_name(&long), IngestName::OfUnknownPartition);
        assert_eq!(
            ingest_name("/w/ns.db/t/data/compact-1-00000.parquet"),
            IngestName::Other
        );
        assert_eq!(
            ingest_name("/w/ns.db/t/metadata/00001-x.metadata.json"),
            IngestName::Other
        );
    }
}
