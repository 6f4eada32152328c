//! Upsert tables: the current row per primary key (`mode = "upsert"`, `primary_key = [...]`).
//!
//! Ingest lands an upsert table's records as it lands any table's (micro-files in pending
//! batches, exactly once by the checkpoints). The commit stage — the tables' single writer —
//! turns a round's files into the current state: it reads the new rows' keys and Kafka
//! positions (nothing else), finds each key's previous live row in the table's [`index`], and
//! commits the new files together with Iceberg v2 **position delete** files naming every row
//! the round supersedes, in one snapshot (`overwrite`) built by hand and swapped in with the
//! catalog's compare-and-set. Athena, Trino, pyiceberg, DuckDB and the library's own scan apply
//! position deletes on read.
//!
//! Which record wins, per key:
//! - within a Kafka partition, the higher offset (producers key records by the primary key, so
//!   a key's records share a partition and Kafka orders them);
//! - a key whose records arrive on several partitions: within one commit round, the later
//!   `kafka_timestamp` (ties: the higher partition) among each partition's last record; across
//!   rounds, the later round — unless both are of the same partition, where the offset decides.
//!
//! Exactly once: the snapshot carries the round's commit id, the offsets and the index's name;
//! a round re-run after a crash or a lost answer finds its commit id and stops, and a round
//! that lost the swap to another writer (compaction) is rebuilt from scratch on the new
//! snapshot (its delete files and index, never referenced, are deleted).

pub mod deletes;
pub mod index;
pub mod read;
pub mod run;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use iceberg::TableIdent;
use iceberg::spec::{
    DataContentType, DataFile, MAIN_BRANCH, ManifestContentType, ManifestFile, Operation, Snapshot,
    SnapshotReference, SnapshotRetention, Struct,
};
use iceberg::table::Table;

use self::index::{GONE, KeyIndex, Location, Run, RunRef};
use self::read::{KeyColumns, KeyedRow};
use crate::catalog::TableCatalog;
use crate::error::{Error, Result};
use crate::spec::RecordedKey;
use crate::table::replace::snapshot_with;
use crate::table::snapshot::{Entry, SnapshotBuild};
use crate::table::{
    COMMIT_ID_PROPERTY, KEY_INDEX_PROPERTY, KEY_INDEX_RUNS_PROPERTY, PRIMARY_KEY_PROPERTY, files,
};

/// The key index each upsert table of this process committed last, by table location, with the
/// path of its newest run: a warm commit whose snapshot still names that run reads nothing.
static WARM: std::sync::LazyLock<std::sync::Mutex<HashMap<String, (String, KeyIndex)>>> =
    std::sync::LazyLock::new(Default::default);

/// The encoding of keys before they are hashed: Arrow's row format, which may change between
/// Arrow releases — so the version is part of every index's definition, and a test ties it to
/// the version in `Cargo.lock` (an upgrade rebuilds the indexes instead of misreading them).
pub const KEY_ENCODING: &str = "arrow-row 58.4.1";

/// Drops the key index this process keeps between commits for the table at `location` (its
/// root, as the table's metadata gives it): its next commit reads the index from the runs its
/// snapshot names, as a cold process does.
pub fn forget_warm_index(location: &str) {
    if let Ok(mut warm) = WARM.lock() {
        warm.remove(location);
    }
}

/// The file of a round's row that is a tombstone (a delete of its key, in no data file).
const TOMBSTONE: u32 = u32::MAX;

/// How often a lost race is rebuilt and retried.
const MAX_ATTEMPTS: u32 = 8;

/// What an upsert commit did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpsertCommit {
    /// The snapshot holding the round (also when an earlier attempt had committed it).
    pub snapshot_id: Option<i64>,
    /// Whether the round was already in the table.
    pub already_committed: bool,
    /// Keys whose live row the round's tombstones deleted.
    pub keys_deleted: u64,
    /// Rows the round made stale (older rows of its keys, and its own superseded rows).
    pub rows_deleted: u64,
    /// Position delete files written.
    pub delete_files: u64,
    /// Keys with a live row after the commit.
    pub keys: u64,
    /// Data files the index had not seen and read (after a compaction, or to build it).
    pub files_indexed: u64,
    /// Entries of the key index after the commit: the live keys and the deleted keys it
    /// remembers.
    pub index_entries: u64,
    /// Bytes of the key index's run the commit wrote.
    pub index_bytes: u64,
    /// Whether that run is a whole base (else the round's changes).
    pub index_base: bool,
    /// Whether the index came from this process's memory (else read from its runs, or built).
    pub index_warm: bool,
}

/// The table properties a round sets with its snapshot, given the table it builds on and the
/// round's tombstones per Kafka partition.
pub type RoundProperties<'a> =
    dyn Fn(&Table, &BTreeMap<i32, u64>) -> Vec<(String, String)> + Sync + 'a;

/// Commits `added` (the round's data files of the table) as upserts keyed by `key`, and
/// `key_deletes` (files of the round's tombstones: location, size) as deletes of their keys,
/// with the snapshot summary `properties` (the commit id among them); the same metadata commit
/// sets the table properties `ledger_properties` gives for the table it builds on and the
/// round's tombstones per Kafka partition (the round's part of the ledger of delivered offsets,
/// folded in, and the tombstones counted) and records `key`
/// ([`PRIMARY_KEY_PROPERTY`]).
pub async fn commit_upsert(
    catalog: &TableCatalog,
    ident: &TableIdent,
    key: &[String],
    added: &[DataFile],
    key_deletes: &[(String, u64)],
    properties: &HashMap<String, String>,
    ledger_properties: &RoundProperties<'_>,
) -> Result<UpsertCommit> {
    let commit_id = properties
        .get(COMMIT_ID_PROPERTY)
        .cloned()
        .ok_or_else(|| Error::Internal(format!("upsert commit to {ident} without a commit id")))?;
    let mut last_unknown = None;
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(20 << attempt.min(6))).await;
        }
        let (table, pointer) = catalog
            .load(ident)
            .await?
            .ok_or_else(|| Error::Config(format!("table {ident} does not exist")))?;
        if let Some(id) = snapshot_with(&table, COMMIT_ID_PROPERTY, &commit_id) {
            return Ok(UpsertCommit {
                snapshot_id: Some(id),
                already_committed: true,
                ..Default::default()
            });
        }
        let built = build(&table, key, added, key_deletes, properties).await?;
        let snapshot_id = built.snapshot.snapshot_id();
        let mut table_properties: HashMap<String, String> =
            ledger_properties(&table, &built.tombstones)
                .into_iter()
                .collect();
        table_properties.insert(PRIMARY_KEY_PROPERTY.to_string(), key.join(","));
        let metadata = table
            .metadata()
            .clone()
            .into_builder(Some(pointer.metadata_location.clone()))
            .set_properties(table_properties)
            .and_then(|b| b.add_snapshot(built.snapshot))
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
            .map_err(|e| Error::iceberg(format!("upsert metadata of {ident}"), e))?
            .metadata;
        match catalog.commit_metadata(&table, &pointer, metadata).await {
            Ok(Some(_)) => {
                let Built {
                    mut index,
                    runs,
                    index_at,
                    report: mut done,
                    ..
                } = built;
                index.committed(runs);
                if let Ok(mut warm) = WARM.lock() {
                    warm.insert(table.metadata().location().to_string(), (index_at, index));
                }
                done.snapshot_id = Some(snapshot_id);
                tracing::info!(table = %ident, snapshot = snapshot_id, deleted = done.rows_deleted,
                    delete_files = done.delete_files, keys = done.keys, index_bytes = done.index_bytes,
                    index_base = done.index_base, index_warm = done.index_warm, "upserts committed");
                return Ok(done);
            }
            Ok(None) => {
                tracing::info!(table = %ident, attempt, "upsert commit lost a race; rebuilding on the new snapshot");
                for path in built.written {
                    let _ = table.file_io().delete(&path).await;
                }
            }
            Err(Error::AlreadyCommitted { .. }) => continue,
            Err(e @ Error::CommitStateUnknown { .. }) => {
                tracing::warn!(table = %ident, attempt, error = %e, "upsert commit outcome unknown; checking again");
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

struct Built {
    snapshot: Snapshot,
    written: Vec<String>,
    report: UpsertCommit,
    /// The index after the round, the runs the snapshot names, the newest's path.
    index: KeyIndex,
    runs: Vec<RunRef>,
    index_at: String,
    /// The round's tombstones per Kafka partition.
    tombstones: BTreeMap<i32, u64>,
}

/// A live data file of the snapshot built on.
struct LiveFile {
    spec_id: i32,
    partition: Struct,
    size: u64,
    sequence: i64,
}

/// The snapshot of the round on the table's current snapshot, with the files it needs written.
async fn build(
    table: &Table,
    key: &[String],
    added: &[DataFile],
    key_deletes: &[(String, u64)],
    properties: &HashMap<String, String>,
) -> Result<Built> {
    let metadata = table.metadata();
    let ident = table.identifier();
    let columns = KeyColumns::of(table, key)?;
    let current = files::load_current(table).await?;
    let mut live: HashMap<String, LiveFile> = current
        .live()
        .map(|f| {
            (
                f.entry.file_path().to_string(),
                LiveFile {
                    spec_id: f.spec_id,
                    partition: f.entry.data_file().partition().clone(),
                    size: f.entry.file_size_in_bytes(),
                    sequence: f.entry.sequence_number().unwrap_or(0),
                },
            )
        })
        .collect();
    let mut report = UpsertCommit::default();
    let mut written = Vec::new();

    // 1. The index, reconciled with the files the snapshot has.
    let definition = format!(
        "xxh3-128 of {KEY_ENCODING}, key field ids {:?}",
        columns.key
    );
    let (mut index, warm) = load_index(table, &definition).await?;
    report.index_warm = warm;
    let covered: HashSet<String> = index.files().map(str::to_string).collect();
    let removed: HashSet<String> = covered
        .iter()
        .filter(|p| !live.contains_key(*p))
        .cloned()
        .collect();
    index.remove_files(&removed);
    let mut unseen: Vec<(&String, &LiveFile)> =
        live.iter().filter(|(p, _)| !covered.contains(*p)).collect();
    let mut deletes: Vec<(u32, u64)> = Vec::new();
    if !unseen.is_empty() {
        // Oldest first, so that a later file's row of a key wins as it did when it landed.
        unseen.sort_by(|a, b| (a.1.sequence, a.0).cmp(&(b.1.sequence, b.0)));
        let deleted = live_deletes(table, &current).await?;
        for (path, f) in unseen {
            let rows = read::keyed_rows(table, path, f.size, &columns).await?;
            let gone = deleted.get(path.as_str());
            let rows: Vec<KeyedRow> = rows
                .into_iter()
                .filter(|r| !gone.is_some_and(|g| g.contains(&r.pos)))
                .collect();
            let file = index.file_id(path);
            let rows: Vec<(u32, KeyedRow)> = rows.into_iter().map(|r| (file, r)).collect();
            apply(&mut index, &rows, &mut deletes);
            report.files_indexed += 1;
        }
    }

    // 2. The round's rows, all its files at once (the winner of a key is the round's, whatever
    // file its record is in).
    let mut round: Vec<(u32, KeyedRow)> = Vec::new();
    for f in added {
        let path = f.file_path();
        if live.contains_key(path) {
            return Err(Error::Internal(format!(
                "upsert commit to {ident}: {path} is already a file of the table, or twice in the round"
            )));
        }
        let rows = read::keyed_rows(table, path, f.file_size_in_bytes(), &columns).await?;
        let file = index.file_id(path);
        round.extend(rows.into_iter().map(|r| (file, r)));
        live.insert(
            path.to_string(),
            LiveFile {
                // Pending files were checked to match the table's partitioning.
                spec_id: metadata.default_partition_spec_id(),
                partition: f.partition().clone(),
                size: f.file_size_in_bytes(),
                sequence: i64::MAX,
            },
        );
    }
    // Tombstones: a key's delete takes part in the round like a record of the key.
    let mut tombstones: BTreeMap<i32, u64> = BTreeMap::new();
    for (path, size) in key_deletes {
        let rows = read::keyed_rows_complete(table, path, *size, &columns).await?;
        for r in &rows {
            *tombstones.entry(r.partition).or_default() += 1;
        }
        round.extend(rows.into_iter().map(|r| (TOMBSTONE, r)));
    }
    report.keys_deleted = apply(&mut index, &round, &mut deletes);
    deletes.sort_unstable();
    deletes.dedup();
    report.rows_deleted = deletes.len() as u64;
    report.keys = index.len() as u64;
    report.index_entries = index.entries() as u64;
    let mut by_file: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (file, pos) in deletes {
        let path = index.path(file).ok_or_else(|| {
            Error::Internal(format!(
                "upsert commit to {ident}: a deleted row names file {file}, which the index does not list"
            ))
        })?;
        match by_file.get_mut(path) {
            Some(positions) => positions.push(pos),
            None => {
                by_file.insert(path.to_string(), vec![pos]);
            }
        }
    }

    // 3. The delete files, one per partition.
    let schema = metadata.current_schema().clone();
    let build = SnapshotBuild::new(table);
    let commit = build.commit();
    let groups = deletes::by_partition(by_file, |p| {
        let f = live.get(p)?;
        let spec = metadata.partition_spec_by_id(f.spec_id)?;
        let path = spec.partition_to_path(&f.partition, schema.clone());
        Some((f.spec_id, &f.partition, path))
    })?;
    let location = metadata.location().trim_end_matches('/');
    let mut delete_files = Vec::new();
    for (n, g) in groups.into_iter().enumerate() {
        let dir = if g.path.is_empty() {
            format!("{location}/data")
        } else {
            format!("{location}/data/{}", g.path)
        };
        let at = format!("{dir}/{commit}-deletes-{n:05}.parquet");
        written.push(at.clone());
        let spec_id = g.spec_id;
        match deletes::write(table, g, &at).await {
            Ok(f) => delete_files.push((spec_id, f)),
            Err(e) => {
                remove_written(table, &written).await;
                return Err(e);
            }
        }
    }
    report.delete_files = delete_files.len() as u64;

    // 4. The index's run (its changes, or a new base), named by the snapshot with the runs
    // before it.
    let name = format!("{commit}.key-index");
    let index_at = format!("{location}/metadata/{name}");
    let base = index.next_is_base();
    let (bytes, entries) = index.encode_run(base)?;
    let runs = index.runs_after(RunRef { name, entries }, base);
    report.index_bytes = bytes.len() as u64;
    report.index_base = base;
    written.push(index_at.clone());
    if let Err(e) = table
        .file_io()
        .new_output(&index_at)
        .map_err(|e| Error::iceberg(index_at.clone(), e))?
        .write(bytes::Bytes::from(bytes))
        .await
    {
        remove_written(table, &written).await;
        return Err(Error::iceberg(
            format!("write the key index {index_at} of {ident}"),
            e,
        ));
    }

    // 5. Manifests, the manifest list, the snapshot.
    let mut properties = properties.clone();
    properties.insert(KEY_INDEX_PROPERTY.to_string(), index_at.clone());
    properties.insert(
        KEY_INDEX_RUNS_PROPERTY.to_string(),
        serde_json::to_string(&runs)
            .map_err(|e| Error::Internal(format!("the key index's runs: {e}")))?,
    );
    let default_spec = metadata.default_partition_spec_id();
    match snapshot(
        build,
        default_spec,
        &current.manifests,
        added,
        delete_files,
        &properties,
    )
    .await
    {
        Ok((snapshot, manifests)) => Ok(Built {
            snapshot,
            written: written.into_iter().chain(manifests).collect(),
            report,
            index,
            runs,
            index_at,
            tombstones,
        }),
        Err(e) => {
            remove_written(table, &written).await;
            Err(e)
        }
    }
}

/// Applies rows (of one round, or of one file being indexed) to the index: each key's winning
/// row becomes its live row, every row it supersedes — in the index or in `rows` — is added to
/// `deletes` as (file, position). Within a Kafka partition the higher offset wins (the first of
/// equal offsets); among partitions, the later timestamp of each partition's last record (ties:
/// the higher partition); against the index, the rows win unless both are of one partition and
/// the index's offset is not lower. A row of file [`TOMBSTONE`] is a delete of its key: when it
/// wins, the key's live row is deleted and the key leaves the index. Returns the keys deleted.
fn apply(index: &mut KeyIndex, rows: &[(u32, KeyedRow)], deletes: &mut Vec<(u32, u64)>) -> u64 {
    let mut deleted_keys = 0;
    // A row to delete; a tombstone or a deleted key's entry has none.
    let stale = |deletes: &mut Vec<(u32, u64)>, file: u32, pos: u64| {
        if file != TOMBSTONE && file != GONE {
            deletes.push((file, pos));
        }
    };
    // Sorted by key, partition, offset (stable: equal offsets keep their order), so that each
    // key's records are together with each partition's last at the end of its own run.
    let mut order: Vec<u32> = (0..rows.len() as u32).collect();
    order.sort_by_key(|&i| {
        let r = &rows[i as usize].1;
        (r.key, r.partition, r.offset)
    });
    let mut candidates: Vec<(u32, KeyedRow)> = Vec::new();
    let mut at = 0;
    while at < order.len() {
        let key = rows[order[at] as usize].1.key;
        let mut end = at;
        while end < order.len() && rows[order[end] as usize].1.key == key {
            end += 1;
        }
        // Each partition's last record of the key: the first of its highest offset.
        candidates.clear();
        let mut p = at;
        while p < end {
            let partition = rows[order[p] as usize].1.partition;
            let mut q = p;
            while q < end && rows[order[q] as usize].1.partition == partition {
                q += 1;
            }
            let top = rows[order[q - 1] as usize].1.offset;
            let first_top = (p..q)
                .find(|&i| rows[order[i] as usize].1.offset == top)
                .unwrap_or(q - 1);
            for i in p..q {
                let (file, r) = rows[order[i] as usize];
                if i == first_top {
                    candidates.push((file, r));
                } else {
                    stale(deletes, file, r.pos);
                }
            }
            p = q;
        }
        at = end;
        candidates.sort_by_key(|(_, r)| (r.timestamp, r.partition));
        let Some((file, winner)) = candidates.pop() else {
            continue;
        };
        for &(f, r) in &candidates {
            stale(deletes, f, r.pos);
        }
        let live = Location {
            file,
            pos: winner.pos,
            partition: winner.partition,
            offset: winner.offset,
            timestamp: winner.timestamp,
        };
        match index.get(key) {
            Some(old) if old.partition == winner.partition && old.offset >= winner.offset => {
                // An older record of the partition committed after a newer one: it is stale.
                stale(deletes, file, winner.pos);
            }
            // A winning tombstone deletes the key's row, and the key keeps its position.
            Some(old) if file == TOMBSTONE => {
                if old.file != GONE {
                    deleted_keys += 1;
                }
                stale(deletes, old.file, old.pos);
                index.delete(key, live);
            }
            None if file == TOMBSTONE => index.delete(key, live),
            Some(old) => {
                stale(deletes, old.file, old.pos);
                index.insert(key, live);
            }
            None => index.insert(key, live),
        }
    }
    deleted_keys
}

/// The index the current snapshot names — this process's copy when the snapshot still names the
/// run it last committed, else read from its runs — and whether it was warm; an empty one when
/// there is none or it cannot be read (then every live file is read again: slower, never
/// wrong).
async fn load_index(table: &Table, definition: &str) -> Result<(KeyIndex, bool)> {
    let props = table
        .metadata()
        .current_snapshot()
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default();
    let Some(newest) = props.get(KEY_INDEX_PROPERTY) else {
        return Ok((KeyIndex::new(definition), false));
    };
    let location = table.metadata().location();
    let metadata_dir = format!("{}/metadata/", location.trim_end_matches('/'));
    if !newest.starts_with(&metadata_dir) || newest[metadata_dir.len()..].contains('/') {
        tracing::warn!(table = %table.identifier(), index = %newest,
            "the key index named is not in the table's metadata directory; rebuilding it from the table's files");
        return Ok((KeyIndex::new(definition), false));
    }
    if let Ok(mut warm) = WARM.lock()
        && let Some((at, index)) = warm.remove(location)
        && at == *newest
        && index.definition() == definition
    {
        return Ok((index, true));
    }
    let why = match read_runs(table, newest, props.get(KEY_INDEX_RUNS_PROPERTY)).await? {
        Ok(runs) => match KeyIndex::from_runs(definition, runs) {
            Ok(index) => return Ok((index, false)),
            Err(e) => e,
        },
        Err(e) => e,
    };
    tracing::warn!(table = %table.identifier(), index = %newest, why = %why,
        "the key index cannot be used; rebuilding it from the table's files");
    Ok((KeyIndex::new(definition), false))
}

/// The key `table`'s rows are kept by, as the table records it: the property every upsert
/// commit sets; for a table only an earlier release committed, the key field ids of its key
/// index's definition (named by the table's columns); rows without either are an append
/// table's.
pub async fn recorded_key(table: &Table) -> Result<RecordedKey> {
    let metadata = table.metadata();
    if let Some(k) = metadata.properties().get(PRIMARY_KEY_PROPERTY) {
        return Ok(RecordedKey::Key(
            k.split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect(),
        ));
    }
    let Some(current) = metadata.current_snapshot() else {
        return Ok(RecordedKey::None);
    };
    let props = &current.summary().additional_properties;
    if let Some(newest) = props.get(KEY_INDEX_PROPERTY) {
        let io = table.file_io();
        let bytes = io
            .new_input(newest)
            .map_err(|e| Error::iceberg(format!("key index {newest}"), e))?
            .read()
            .await
            .map_err(|e| Error::iceberg(format!("read the key index run {newest}"), e))?;
        let at = newest.clone();
        let run = tokio::task::spawn_blocking(move || Run::decode(&bytes, &at))
            .await
            .map_err(|e| Error::Internal(format!("decode the key index: {e}")))?;
        if let Ok(run) = run
            && let Some(ids) = definition_key_ids(run.definition())
        {
            let schema = metadata.current_schema();
            return Ok(RecordedKey::Key(
                ids.into_iter()
                    .map(|id| {
                        schema
                            .field_by_id(id)
                            .map_or_else(|| format!("#{id}"), |f| f.name.clone())
                    })
                    .collect(),
            ));
        }
    }
    let rows = props
        .get("total-records")
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(if rows > 0 {
        RecordedKey::Append
    } else {
        RecordedKey::None
    })
}

/// The key field ids of an index definition (`xxh3-128 of …, key field ids [1, 2]`).
fn definition_key_ids(definition: &str) -> Option<Vec<i32>> {
    let (_, ids) = definition.split_once("key field ids [")?;
    let ids = ids.strip_suffix(']')?;
    ids.split(',')
        .map(|i| i.trim().parse::<i32>().ok())
        .collect()
}

/// The runs a snapshot names, read and decoded (all at once), oldest first; `Ok(Err(why))` when
/// they cannot be used (then the index is rebuilt), `Err` when one could not be read though it
/// is there (an outage: the commit fails and is retried, rather than rebuild on a transient
/// fault).
async fn read_runs(
    table: &Table,
    newest: &str,
    runs: Option<&String>,
) -> Result<std::result::Result<Vec<(RunRef, Run)>, String>> {
    let Some((dir, runs)) = index::named_runs(newest, runs.map(String::as_str)) else {
        return Ok(Err(format!(
            "its runs are not named by plain, distinct file names (at most {}): {runs:?}",
            index::MAX_RUNS
        )));
    };
    let reads = runs.into_iter().map(|r| {
        let dir = &dir;
        async move {
            let at = format!("{dir}/{}", r.name);
            let io = table.file_io();
            let read = match io.new_input(&at) {
                Ok(input) => input.read().await,
                Err(e) => Err(e),
            };
            let bytes = match read {
                Ok(bytes) => bytes,
                Err(e) => {
                    if matches!(io.exists(&at).await, Ok(false)) {
                        return Ok(Err(format!("key index run {at} is gone")));
                    }
                    return Err(Error::iceberg(format!("read the key index run {at}"), e));
                }
            };
            let run = tokio::task::spawn_blocking(move || Run::decode(&bytes, &at))
                .await
                .map_err(|e| Error::Internal(format!("decode the key index: {e}")))?;
            Ok(run.map(|run| (r, run)))
        }
    });
    let read: Vec<std::result::Result<(RunRef, Run), String>> =
        futures::future::try_join_all(reads).await?;
    Ok(read.into_iter().collect())
}

/// The positions deleted by the snapshot's live position delete files, per data file.
async fn live_deletes(
    table: &Table,
    current: &files::SnapshotFiles,
) -> Result<HashMap<String, HashSet<u64>>> {
    let mut out: HashMap<String, HashSet<u64>> = HashMap::new();
    for m in current.delete_manifests() {
        let manifest = m
            .load_manifest(table.file_io())
            .await
            .map_err(|e| Error::iceberg(format!("manifest {}", m.manifest_path), e))?;
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            match e.content_type() {
                DataContentType::PositionDeletes => {
                    let rows = read::position_deletes(table, e.file_path(), e.file_size_in_bytes())
                        .await?;
                    for (path, pos) in rows {
                        out.entry(path).or_default().insert(pos);
                    }
                }
                other => {
                    return Err(Error::Config(format!(
                        "table {}: delete file {} holds {other:?}, which upsert tables do not apply; only position deletes are supported",
                        table.identifier(),
                        e.file_path()
                    )));
                }
            }
        }
    }
    Ok(out)
}

/// The round's snapshot on the current one: every manifest carried, one data manifest of the
/// new files, a delete manifest per partition spec of the delete files.
async fn snapshot(
    mut build: SnapshotBuild<'_>,
    default_spec: i32,
    manifests: &[ManifestFile],
    added: &[DataFile],
    delete_files: Vec<(i32, DataFile)>,
    properties: &HashMap<String, String>,
) -> Result<(Snapshot, Vec<String>)> {
    for m in manifests {
        build.carry(m.clone());
    }
    if !added.is_empty() {
        let entries = added.iter().map(|f| Entry::Added(Box::new(f.clone())));
        build
            .manifest(default_spec, ManifestContentType::Data, entries.collect())
            .await?;
    }
    let operation = if delete_files.is_empty() {
        Operation::Append
    } else {
        Operation::Overwrite
    };
    let mut by_spec: BTreeMap<i32, Vec<Entry>> = BTreeMap::new();
    for (spec_id, f) in delete_files {
        by_spec
            .entry(spec_id)
            .or_default()
            .push(Entry::Added(Box::new(f)));
    }
    for (spec_id, entries) in by_spec {
        build
            .manifest(spec_id, ManifestContentType::Deletes, entries)
            .await?;
    }
    build.finish(operation, properties).await
}

async fn remove_written(table: &Table, written: &[String]) {
    for path in written {
        let _ = table.file_io().delete(path).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_encoding_names_the_arrow_row_in_use() {
        let lock = include_str!("../../../../Cargo.lock");
        let version = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"arrow-row\""))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .map(|v| v.trim_matches('"'))
            .expect("arrow-row in Cargo.lock");
        assert_eq!(
            KEY_ENCODING,
            format!("arrow-row {version}"),
            "arrow-row changed: bump KEY_ENCODING so that key indexes are rebuilt"
        );
    }

    fn row(key: u128, pos: u64, partition: i32, offset: i64, timestamp: i64) -> KeyedRow {
        KeyedRow {
            key,
            pos,
            partition,
            offset,
            timestamp,
        }
    }

    #[test]
    fn the_later_timestamp_wins_across_partitions_whatever_the_file_order() {
        for order in [[0usize, 1], [1, 0]] {
            let mut index = KeyIndex::new("t");
            let f1 = index.file_id("f1");
            let f2 = index.file_id("f2");
            let rows = [(f1, row(7, 0, 1, 5, 200)), (f2, row(7, 0, 0, 9, 100))];
            let round: Vec<(u32, KeyedRow)> = order.iter().map(|&i| rows[i]).collect();
            let mut deletes = Vec::new();
            apply(&mut index, &round, &mut deletes);
            let live = index.get(7).expect("key 7");
            assert_eq!(index.path(live.file), Some("f1"), "order {order:?}");
            assert_eq!(deletes, vec![(f2, 0)], "order {order:?}");
        }
    }

    #[test]
    fn within_a_partition_the_higher_offset_wins_and_an_older_record_is_stale() {
        let mut index = KeyIndex::new("t");
        let f = index.file_id("f");
        let mut deletes = Vec::new();
        apply(
            &mut index,
            &[(f, row(1, 0, 0, 10, 0)), (f, row(1, 1, 0, 12, 0))],
            &mut deletes,
        );
        assert_eq!(deletes, vec![(f, 0)]);
        assert_eq!(index.get(1).map(|l| l.offset), Some(12));
        // A later round with an older offset of the same partition: its row is the stale one.
        let g = index.file_id("g");
        let mut deletes = Vec::new();
        apply(&mut index, &[(g, row(1, 0, 0, 11, 0))], &mut deletes);
        assert_eq!(deletes, vec![(g, 0)]);
        assert_eq!(index.get(1).map(|l| l.offset), Some(12));
        // A newer one replaces the live row.
        let mut deletes = Vec::new();
        apply(&mut index, &[(g, row(1, 1, 0, 13, 0))], &mut deletes);
        assert_eq!(deletes, vec![(f, 1)]);
        assert_eq!(index.get(1).map(|l| (l.file, l.pos)), Some((g, 1)));
    }

    #[test]
    fn a_tombstone_deletes_its_key_and_an_older_record_cannot_bring_it_back() {
        let mut index = KeyIndex::new("t");
        let f = index.file_id("f");
        let mut deletes = Vec::new();
        apply(&mut index, &[(f, row(5, 0, 0, 10, 0))], &mut deletes);
        assert_eq!(index.len(), 1);
        // A tombstone at offset 20 deletes the row at f:0.
        let mut deletes = Vec::new();
        let gone = apply(
            &mut index,
            &[(TOMBSTONE, row(5, 0, 0, 20, 0))],
            &mut deletes,
        );
        assert_eq!((gone, deletes, index.len()), (1, vec![(f, 0)], 0));
        // A record of offset 15 landing later (a replay) is older than the tombstone: stale.
        let g = index.file_id("g");
        let mut deletes = Vec::new();
        apply(&mut index, &[(g, row(5, 3, 0, 15, 0))], &mut deletes);
        assert_eq!((deletes, index.len()), (vec![(g, 3)], 0));
        // The tombstone again (a re-delivery) deletes nothing more.
        let mut deletes = Vec::new();
        let gone = apply(
            &mut index,
            &[(TOMBSTONE, row(5, 0, 0, 20, 0))],
            &mut deletes,
        );
        assert_eq!((gone, deletes.len()), (0, 0));
        // A newer record brings the key back.
        let mut deletes = Vec::new();
        apply(&mut index, &[(g, row(5, 4, 0, 21, 0))], &mut deletes);
        assert!(deletes.is_empty(), "no row to delete: {deletes:?}");
        assert_eq!(index.get(5).map(|l| (l.file, l.pos)), Some((g, 4)));
        // In one round, a tombstone after a record of its partition wins; before it, loses.
        let mut deletes = Vec::new();
        apply(
            &mut index,
            &[(TOMBSTONE, row(9, 0, 1, 7, 0)), (g, row(9, 5, 1, 6, 0))],
            &mut deletes,
        );
        assert_eq!(deletes, vec![(g, 5)]);
        assert_eq!(index.get(9).map(|l| l.file), Some(GONE));
        let mut deletes = Vec::new();
        apply(
            &mut index,
            &[(TOMBSTONE, row(8, 0, 1, 7, 0)), (g, row(8, 6, 1, 8, 0))],
            &mut deletes,
        );
        assert!(deletes.is_empty());
        assert_eq!(index.get(8).map(|l| (l.file, l.pos)), Some((g, 6)));
    }
}
