//! Orphan clean-up: deleting what nothing references, never what a retry may still register.

use std::collections::{HashMap, HashSet};

use iceberg::spec::SnapshotRef;

use super::{MaintenanceOptions, TableMaintenance, referenced};
use crate::backend::Backend;
use crate::checkpoint::SourcePartition;
use crate::error::Result;
use crate::storage::ObjectInfo;
use crate::table::pending::resolve_files;

/// Spilled file lists (`_pending/…`) of batches that were committed.
pub(super) async fn remove_spilled_lists(
    backend: &Backend,
    options: &MaintenanceOptions,
) -> Result<()> {
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

/// Partition state files (`_state/partitions/{topic}/runs/…`) no partition's state is in and
/// no run of one is in, and whole states of earlier layouts (`_state/partitions/…`, and
/// `_state/{topic}/…` of releases before 0.4) no item names: those of losing duplicates and of
/// crashed invocations (written before their transaction), and replaced ones. Only the spec's topics are looked at; the interval joins' state is
/// [`remove_join_states`]'.
pub(super) async fn remove_partition_states(
    backend: &Backend,
    tables: &crate::tables::TableSet,
    options: &MaintenanceOptions,
) -> Result<u64> {
    let root = format!("{}/_state/", backend.warehouse.root());
    let mut deleted = 0;
    let topics: HashSet<String> = tables
        .tables
        .values()
        .filter_map(|d| d.spec.as_ref())
        .filter(|t| t.event_time.is_some())
        .map(|t| t.topic.clone())
        .collect();
    for topic in topics {
        let name = crate::partition::topic_in_name(&topic);
        for prefix in [
            format!("{root}partitions/{name}/"),
            format!("{root}{name}/"),
        ] {
            if prefix == format!("{root}join/") || prefix == format!("{root}partitions/") {
                continue;
            }
            let candidates = old_objects(backend, &prefix, options).await?;
            if candidates.is_empty() {
                continue;
            }
            // The items are read after the listing: a state written and named in between is
            // seen. A state file is in use while a partition's state is in it or names a run
            // in it.
            let mut named: HashSet<String> = HashSet::new();
            let mut files = crate::ingest::StateFiles::default();
            for (source, stored) in backend.state.topic_states(&topic).await? {
                let Some(stored) = stored else { continue };
                named.extend(
                    crate::ingest::state_files_in_use(
                        &backend.warehouse,
                        &mut files,
                        &source,
                        &stored,
                    )
                    .await?,
                );
            }
            // And while a pending batch's rows are carried in it (read once a file would go).
            let mut carrying: Option<HashSet<String>> = None;
            for o in candidates {
                let state_object = o.location.ends_with(".state") || o.location.ends_with(".run");
                if !state_object || named.contains(&o.location) {
                    continue;
                }
                if carrying.is_none() {
                    carrying = Some(carrying_files(backend).await?);
                }
                if carrying.as_ref().is_some_and(|c| c.contains(&o.location)) {
                    continue;
                }
                if delete_if_still_old(backend, &o.location, options).await? {
                    deleted += 1;
                }
            }
        }
    }
    Ok(deleted)
}

/// The state files pending batches carry rows in ([`crate::checkpoint::CarriedRows`]): the
/// commit has not written those rows yet. Every pending batch is read, or none (an unreadable
/// one is an error: its rows may be in any of them).
async fn carrying_files(backend: &Backend) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    for batch in backend.state.pending_complete().await? {
        for f in resolve_files(backend, &batch).await? {
            if let Some(c) = f.carried {
                out.insert(c.file);
            }
        }
    }
    Ok(out)
}

/// Interval joins' state objects (`_state/join/{table}/…`) that no retained snapshot of the
/// join table names (rounds that lost, crashed, or whose delete of the replaced state failed).
#[cfg(feature = "sql")]
pub(super) async fn remove_join_states(
    backend: &Backend,
    tables: &crate::tables::TableSet,
    options: &MaintenanceOptions,
) -> Result<u64> {
    let mut deleted = 0;
    for (name, _) in &tables.joins {
        let prefix = format!("{}/_state/join/{name}/", backend.warehouse.root());
        let candidates = old_objects(backend, &prefix, options).await?;
        if candidates.is_empty() {
            continue;
        }
        let Some((table, _)) = backend.catalog.load(&tables.ident(name)).await? else {
            continue;
        };
        let mut named = HashSet::new();
        for s in table.metadata().snapshots() {
            let Some(json) = s
                .summary()
                .additional_properties
                .get(crate::table::JOIN_STATE_PROPERTY)
            else {
                continue;
            };
            match crate::commit::join::state_objects(json) {
                Some(objects) => named.extend(objects),
                // A state this release cannot read: keep everything.
                None => {
                    named.insert(String::new());
                }
            }
        }
        if named.contains("") {
            continue;
        }
        for o in candidates {
            if named.contains(&o.location) {
                continue;
            }
            if delete_if_still_old(backend, &o.location, options).await? {
                deleted += 1;
            }
        }
    }
    Ok(deleted)
}

/// Objects under `prefix` older than the grace period.
async fn old_objects(
    backend: &Backend,
    prefix: &str,
    options: &MaintenanceOptions,
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
    options: &MaintenanceOptions,
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
        for batch in backend.state.pending_complete().await? {
            if let Some(l) = &batch.files_location {
                refs.pending_lists.insert(l.clone());
            }
            for f in resolve_files(backend, &batch).await? {
                if let Some(k) = &f.key_deletes {
                    refs.pending_files.insert(k.file.clone());
                }
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
    /// an ingest file a retry could still write and register. A file is named after the first
    /// partition of its batch and that partition's first offset; to write the same file again,
    /// an invocation must plan that offset, which it cannot once the partition's checkpoint is
    /// past it (and one that planned it earlier loses its conditional write). So a file is
    /// needed while that checkpoint is at or before its first offset, or when the name does not
    /// tell the partition.
    fn may_be_needed(&self, location: &str) -> bool {
        if self.pending_files.contains(location) || self.pending_lists.contains(location) {
            return true;
        }
        match ingest_name(location) {
            IngestName::Of(source, first) => self
                .next_offsets
                .get(&source)
                .is_none_or(|next| *next <= first),
            IngestName::OfUnknownPartition => true,
            IngestName::Other => false,
        }
    }
}

/// What an object's name says about the ingest batch that wrote it.
#[derive(Debug, PartialEq, Eq)]
enum IngestName {
    /// An ingest file or spilled list whose batch's first topic-partition is this, from this
    /// offset.
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
            let (hash, seq, _last, first, partition, topic) = (
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
            );
            let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
            if hash.len() != 16 || !digits(seq, 3) || !digits(first, 20) || !digits(_last, 20) {
                return None;
            }
            return Some((topic, partition, first));
        }
        let stem = name.strip_suffix(".json")?;
        let mut dirs = location.rsplit('/').skip(1);
        let partition = dirs.next()?;
        let topic = dirs.next()?;
        if dirs.next()? != "_pending" {
            return None;
        }
        Some((topic, partition, stem.split('-').next()?))
    };
    let Some((topic, partition, first)) = parsed() else {
        return IngestName::Other;
    };
    match (
        crate::partition::topic_from_name(topic),
        partition.parse::<i32>(),
        first.parse::<i64>(),
    ) {
        (Some(topic), Ok(partition), Ok(first)) => {
            IngestName::Of(SourcePartition::new(topic, partition), first)
        }
        _ => IngestName::OfUnknownPartition,
    }
}

pub(super) async fn remove_orphans(
    backend: &Backend,
    ident: &iceberg::TableIdent,
    options: &MaintenanceOptions,
    waiting: &HashSet<String>,
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
        if keep.contains(&o.location)
            || waiting.contains(&o.location)
            || guard.may_be_needed(&o.location)
        {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingest_names_tell_their_partition_or_keep_the_file() {
        let f = "/w/ns.db/orders/data/d=1/orders.v2-3-00000000000000000010-00000000000000000019-000-0123456789abcdef.parquet";
        assert_eq!(
            ingest_name(f),
            IngestName::Of(SourcePartition::new("orders.v2", 3), 10)
        );
        let spilled =
            "/w/_pending/a%2Fb/0/00000000000000000001-00000000000000000002-0123456789abcdef.json";
        assert_eq!(
            ingest_name(spilled),
            IngestName::Of(SourcePartition::new("a/b", 0), 1)
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
