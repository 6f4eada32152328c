//! The properties streamtable gives a table and its snapshots: the snapshot summary keys by
//! which a commit is recognised after a crash, the table properties every table is created
//! with, and the retention other engines' clean-up reads (Athena's `VACUUM` reads
//! `vacuum_max_snapshot_age_seconds` and `vacuum_min_snapshots_to_keep`; Spark's
//! `expire_snapshots` the `history.expire.*` ones).

use std::collections::HashMap;

/// Snapshot summary key carrying the commit id of an append (the commit stage's intent).
pub const COMMIT_ID_PROPERTY: &str = "streamtable.commit-id";
/// Snapshot summary key naming the replace commit that made the snapshot (compaction,
/// maintenance).
pub const REPLACE_ID_PROPERTY: &str = "streamtable.replace-id";
/// Snapshot summary key of a join table naming its state (see [`crate::commit::join`]); a
/// replace snapshot carries it over.
pub const JOIN_STATE_PROPERTY: &str = "streamtable.join.state";
/// Snapshot summary key of an upsert table naming its key index (see [`crate::upsert`]); a
/// replace snapshot carries it over (the next commit reconciles it with the files).
pub const KEY_INDEX_PROPERTY: &str = "streamtable.key-index";
/// Snapshot summary key of an upsert table listing its key index's runs, oldest first, with
/// their entry counts (JSON); carried over with [`KEY_INDEX_PROPERTY`].
pub const KEY_INDEX_RUNS_PROPERTY: &str = "streamtable.key-index.runs";
/// Prefix of the snapshot summary keys carrying committed offsets.
pub const OFFSET_PROPERTY_PREFIX: &str = "streamtable.offset.";

/// Table property of an upsert table: the columns its rows are kept by (comma-separated), set
/// by every upsert commit, so that a changed `primary_key` is seen before it re-keys the table.
pub const PRIMARY_KEY_PROPERTY: &str = "streamtable.primary-key";

/// Table property: the view over a windowed table's partial rows (its name).
pub const VIEW_NAME_PROPERTY: &str = "streamtable.view.name";
/// Table property: the view's SQL.
pub const VIEW_SQL_PROPERTY: &str = "streamtable.view.sql";

/// Snapshots maintenance keeps whatever their age, by default.
pub const DEFAULT_KEEP_LAST_SNAPSHOTS: usize = 10;
/// Snapshots younger than this (milliseconds) are kept, by default.
pub const DEFAULT_SNAPSHOT_RETENTION_MS: i64 = 24 * 3600 * 1000;

/// Properties of every table streamtable creates (with the default retention; maintenance keeps
/// it equal to the options in effect).
pub fn table_properties(target_file_size_bytes: u64) -> HashMap<String, String> {
    let retention =
        retention_properties(DEFAULT_KEEP_LAST_SNAPSHOTS, DEFAULT_SNAPSHOT_RETENTION_MS);
    let mut p = HashMap::from([
        ("write.format.default".into(), "parquet".into()),
        ("write.parquet.compression-codec".into(), "zstd".into()),
        (
            "write.target-file-size-bytes".into(),
            target_file_size_bytes.to_string(),
        ),
        ("streamtable.managed".into(), "true".into()),
    ]);
    p.extend(retention);
    p
}

/// The properties that state a retention of the last `keep_last` snapshots and those younger
/// than `retention_ms`.
pub fn retention_properties(keep_last: usize, retention_ms: i64) -> Vec<(String, String)> {
    let keep = keep_last.max(1).to_string();
    let age_ms = retention_ms.max(0);
    vec![
        (
            "history.expire.max-snapshot-age-ms".into(),
            age_ms.to_string(),
        ),
        ("history.expire.min-snapshots-to-keep".into(), keep.clone()),
        (
            "vacuum_max_snapshot_age_seconds".into(),
            (age_ms / 1000).to_string(),
        ),
        ("vacuum_min_snapshots_to_keep".into(), keep),
    ]
}
