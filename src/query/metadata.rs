//! The Iceberg metadata tables Trino and Athena have, under the same names: `"orders$snapshots"`,
//! `"orders$history"`, `"orders$files"` and `"orders$partitions"` (quoted: `$` is not a plain
//! identifier's character). Snapshots and history come from the table's metadata; files and
//! partitions read the current snapshot's manifests, so they are made only for a query that
//! names them.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, MapBuilder, RecordBatch, StringArray,
    StringBuilder, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use iceberg::table::Table;

use crate::error::{Error, Result};

/// The metadata tables, by suffix.
pub const KINDS: [&str; 4] = ["snapshots", "history", "files", "partitions"];

/// Whether a metadata table of `kind` reads manifests (made only for a query naming it).
pub fn reads_manifests(kind: &str) -> bool {
    matches!(kind, "files" | "partitions")
}

fn utc_ms(values: Vec<i64>) -> ArrayRef {
    Arc::new(TimestampMillisecondArray::from(values).with_timezone("UTC"))
}

fn ts_field(name: &str) -> Field {
    Field::new(
        name,
        DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
        false,
    )
}

fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>, what: &str) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| Error::Internal(format!("metadata table {what}: {e}")))
}

/// `$snapshots`: every snapshot the metadata keeps, oldest first: when it was committed, its
/// id and parent, its operation, its manifest list and its summary (a map, as Trino's).
pub fn snapshots(table: &Table) -> Result<RecordBatch> {
    let mut snapshots: Vec<_> = table.metadata().snapshots().collect();
    snapshots.sort_by_key(|s| (s.timestamp_ms(), s.sequence_number()));
    let mut summary = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    for s in &snapshots {
        let mut entries: Vec<_> = s.summary().additional_properties.iter().collect();
        entries.sort();
        for (k, v) in entries {
            summary.keys().append_value(k);
            summary.values().append_value(v);
        }
        summary
            .append(true)
            .map_err(|e| Error::Internal(format!("snapshot summary: {e}")))?;
    }
    let summary: ArrayRef = Arc::new(summary.finish());
    let fields = vec![
        ts_field("committed_at"),
        Field::new("snapshot_id", DataType::Int64, false),
        Field::new("parent_id", DataType::Int64, true),
        Field::new("operation", DataType::Utf8, false),
        Field::new("manifest_list", DataType::Utf8, false),
        Field::new("summary", summary.data_type().clone(), true),
    ];
    let columns: Vec<ArrayRef> = vec![
        utc_ms(snapshots.iter().map(|s| s.timestamp_ms()).collect()),
        Arc::new(Int64Array::from_iter_values(
            snapshots.iter().map(|s| s.snapshot_id()),
        )),
        Arc::new(Int64Array::from(
            snapshots
                .iter()
                .map(|s| s.parent_snapshot_id())
                .collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from_iter_values(
            snapshots.iter().map(|s| s.summary().operation.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            snapshots.iter().map(|s| s.manifest_list()),
        )),
        summary,
    ];
    batch(fields, columns, "$snapshots")
}

/// `$history`: when each snapshot became the current one, and whether it is an ancestor of
/// the current snapshot (not one rolled back).
pub fn history(table: &Table) -> Result<RecordBatch> {
    let meta = table.metadata();
    let mut ancestors = std::collections::BTreeSet::new();
    let mut at = meta.current_snapshot();
    while let Some(s) = at {
        if !ancestors.insert(s.snapshot_id()) {
            break;
        }
        at = s.parent_snapshot_id().and_then(|p| meta.snapshot_by_id(p));
    }
    let log = meta.history();
    let fields = vec![
        ts_field("made_current_at"),
        Field::new("snapshot_id", DataType::Int64, false),
        Field::new("parent_id", DataType::Int64, true),
        Field::new("is_current_ancestor", DataType::Boolean, false),
    ];
    let columns: Vec<ArrayRef> = vec![
        utc_ms(log.iter().map(|e| e.timestamp_ms).collect()),
        Arc::new(Int64Array::from_iter_values(
            log.iter().map(|e| e.snapshot_id),
        )),
        Arc::new(Int64Array::from(
            log.iter()
                .map(|e| {
                    meta.snapshot_by_id(e.snapshot_id)
                        .and_then(|s| s.parent_snapshot_id())
                })
                .collect::<Vec<_>>(),
        )),
        Arc::new(BooleanArray::from(
            log.iter()
                .map(|e| ancestors.contains(&e.snapshot_id))
                .collect::<Vec<_>>(),
        )),
    ];
    batch(fields, columns, "$history")
}

/// One live file of the current snapshot.
struct LiveFile {
    content: i32,
    path: String,
    format: String,
    spec_id: i32,
    partition: String,
    records: i64,
    bytes: i64,
}

async fn live_files(table: &Table) -> Result<Vec<LiveFile>> {
    use crate::table::files;
    let snapshot = files::load_current(table).await?;
    let deletes = files::live_delete_files(table, &snapshot).await?;
    let meta = table.metadata();
    let schema = meta.current_schema().clone();
    let mut out = Vec::new();
    for e in snapshot.live().chain(deletes.iter()) {
        let f = e.entry.data_file();
        let partition = match meta.partition_spec_by_id(e.spec_id) {
            Some(spec) if !spec.fields().is_empty() => {
                spec.partition_to_path(f.partition(), schema.clone())
            }
            _ => String::new(),
        };
        out.push(LiveFile {
            content: f.content_type() as i32,
            path: f.file_path().to_string(),
            format: f.file_format().to_string(),
            spec_id: e.spec_id,
            partition,
            records: i64::try_from(f.record_count()).unwrap_or(i64::MAX),
            bytes: i64::try_from(f.file_size_in_bytes()).unwrap_or(i64::MAX),
        });
    }
    Ok(out)
}

/// `$files`: the current snapshot's live files: data files (content 0) and delete files (1:
/// position deletes, 2: equality deletes), with their partition as a path
/// (`created_at_day=2026-12-07`), records and bytes.
pub async fn files(table: &Table) -> Result<RecordBatch> {
    let files = live_files(table).await?;
    let fields = vec![
        Field::new("content", DataType::Int32, false),
        Field::new("file_path", DataType::Utf8, false),
        Field::new("file_format", DataType::Utf8, false),
        Field::new("spec_id", DataType::Int32, false),
        Field::new("partition", DataType::Utf8, false),
        Field::new("record_count", DataType::Int64, false),
        Field::new("file_size_in_bytes", DataType::Int64, false),
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from_iter_values(
            files.iter().map(|f| f.content),
        )),
        Arc::new(StringArray::from_iter_values(
            files.iter().map(|f| f.path.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            files.iter().map(|f| f.format.as_str()),
        )),
        Arc::new(Int32Array::from_iter_values(
            files.iter().map(|f| f.spec_id),
        )),
        Arc::new(StringArray::from_iter_values(
            files.iter().map(|f| f.partition.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(
            files.iter().map(|f| f.records),
        )),
        Arc::new(Int64Array::from_iter_values(files.iter().map(|f| f.bytes))),
    ];
    batch(fields, columns, "$files")
}

/// `$partitions`: per partition of the current snapshot, its data files' records, count and
/// bytes, and its delete files' count and records (rows they delete).
pub async fn partitions(table: &Table) -> Result<RecordBatch> {
    let mut by: std::collections::BTreeMap<String, [i64; 5]> = Default::default();
    for f in live_files(table).await? {
        let e = by.entry(f.partition).or_default();
        if f.content == 0 {
            e[0] += f.records;
            e[1] += 1;
            e[2] += f.bytes;
        } else {
            e[3] += 1;
            e[4] += f.records;
        }
    }
    let col = |i: usize| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(by.values().map(|v| v[i])))
    };
    let fields = vec![
        Field::new("partition", DataType::Utf8, false),
        Field::new("record_count", DataType::Int64, false),
        Field::new("file_count", DataType::Int64, false),
        Field::new("total_size", DataType::Int64, false),
        Field::new("delete_file_count", DataType::Int64, false),
        Field::new("deleted_record_count", DataType::Int64, false),
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(by.keys().map(String::as_str))),
        col(0),
        col(1),
        col(2),
        col(3),
        col(4),
    ];
    batch(fields, columns, "$partitions")
}

/// The metadata table `kind` of `table`.
pub async fn of(table: &Table, kind: &str) -> Result<RecordBatch> {
    match kind {
        "snapshots" => snapshots(table),
        "history" => history(table),
        "files" => files(table).await,
        "partitions" => partitions(table).await,
        other => Err(Error::Query(format!(
            "no metadata table ${other}: there are {}",
            KINDS.map(|k| format!("${k}")).join(", ")
        ))),
    }
}
