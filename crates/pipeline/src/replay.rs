//! Replay: a batch the event source mapping gave up on, fed back through ingest, exactly once.
//!
//! When ingest keeps failing (S3, DynamoDB or Glue unavailable for longer than the event source
//! mapping retries), the mapping sends the batch to its on-failure destination and moves on.
//! An Amazon S3 destination keeps the whole invocation record (`payload` holds the event); a
//! local copy of the event works too. Those records never landed, but later batches moved the
//! partition's checkpoint past them, so plain ingest would drop them as already seen.
//!
//! Per topic-partition, under a lock that keeps two replays apart:
//! 1. records at or past the checkpoint go through the ingest handler as usual;
//! 2. for records below it, the offsets that did land are looked up — in pending batches first,
//!    then in the tables (the topic's table and `dead_letters`, or for a topic with no table of
//!    its own the derived tables that keep its records' coordinates; in that order, so a commit
//!    moving a batch from pending to the table in between is seen on one side or the other);
//! 3. the rest are landed as a pending batch, written only while the lock is still held.
//!
//! Replaying the same record twice, or concurrently, lands nothing twice.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use iceberg::spec::{DataFile, Datum, PrimitiveLiteral};
use parquet::arrow::ProjectionMask;
use serde::Serialize;

use crate::backend::Backend;
use crate::checkpoint::SourcePartition;
use crate::error::{Error, Result};
use crate::esm::{EsmEvent, EsmRecord};
use crate::ingest::{Ingestor, group_by_partition};
use crate::spec::{DEAD_LETTER_TABLE, PipelineSpec};
use crate::tables::TableSet;

/// How long a replay may hold a partition's lock before another may take it over.
pub const LOCK_TTL_MS: i64 = 15 * 60 * 1000;

/// What a replay did to one topic-partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PartitionReplay {
    /// The topic-partition.
    pub source: String,
    /// Records of the partition in the replayed batch.
    pub records: u64,
    /// Records that had landed already (found in a pending batch or a table).
    pub already_landed: u64,
    /// Records landed by this replay: accepted into the table.
    pub accepted: u64,
    /// Records landed by this replay as dead letters.
    pub dead_lettered: u64,
}

/// Reads a failed batch: the invocation record an Amazon S3 on-failure destination writes
/// (`payload` holding the event as a JSON string or object), or an MSK event itself.
pub fn parse_failed_batch(bytes: &[u8], origin: &str) -> Result<EsmEvent> {
    let bad = |message: String| Error::Event {
        origin: origin.to_string(),
        message,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let event = match value.get("payload") {
        Some(serde_json::Value::String(inner)) => serde_json::from_str(inner)
            .map_err(|e| bad(format!("payload is not an MSK event: {e}")))?,
        Some(payload @ serde_json::Value::Object(_)) => serde_json::from_value(payload.clone())
            .map_err(|e| bad(format!("payload is not an MSK event: {e}")))?,
        Some(_) | None if value.get("requestContext").is_some() => {
            let info = value
                .get("KafkaBatchInfo")
                .map(|i| i.to_string())
                .unwrap_or_default();
            return Err(bad(format!(
                "this failure record carries no payload (only S3 destinations keep the records, \
                 and not when the batch exceeded the payload limit); read the offsets it names \
                 from Kafka and replay them as an event file: {info}"
            )));
        }
        _ => serde_json::from_value(value).map_err(|e| {
            bad(format!(
                "neither an on-failure record nor an MSK event: {e}"
            ))
        })?,
    };
    Ok(event)
}

/// Replays a failed batch. Fails (retryably) when another replay holds a partition's lock.
pub async fn replay(
    ingestor: &Ingestor,
    backend: &Backend,
    spec: &PipelineSpec,
    event: &EsmEvent,
) -> Result<Vec<PartitionReplay>> {
    replay_with(ingestor, backend, spec, event, &ReplayOptions::default()).await
}

/// What a replay may do beyond the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplayOptions {
    /// Land a batch that starts past its partition's checkpoint: the offsets in between will
    /// never be delivered (Kafka's own gaps: a transaction's marker, compacted records).
    pub after_gap: bool,
}

/// [`replay`] with `options`.
pub async fn replay_with(
    ingestor: &Ingestor,
    backend: &Backend,
    spec: &PipelineSpec,
    event: &EsmEvent,
    options: &ReplayOptions,
) -> Result<Vec<PartitionReplay>> {
    let tables = TableSet::new(spec, &backend.namespace)?;
    let mut out = Vec::new();
    for (source, records) in group_by_partition(event)? {
        let lock = format!("replay#{source}");
        let holder = uuid::Uuid::new_v4().to_string();
        let now = backend.clock.now_ms();
        if !backend
            .state
            .try_lock(&lock, &holder, now, now + LOCK_TTL_MS)
            .await?
        {
            return Err(Error::State {
                op: "replay",
                message: format!("another replay of {source} is running; try again when it ends"),
                retryable: true,
            });
        }
        let result = replay_partition(
            ingestor, backend, spec, &tables, &source, &records, &lock, &holder, options,
        )
        .await;
        backend.state.unlock(&lock, &holder).await?;
        out.push(result?);
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
async fn replay_partition(
    ingestor: &Ingestor,
    backend: &Backend,
    spec: &PipelineSpec,
    tables: &TableSet,
    source: &SourcePartition,
    records: &[&EsmRecord],
    lock: &str,
    holder: &str,
    options: &ReplayOptions,
) -> Result<PartitionReplay> {
    let mut report = PartitionReplay {
        source: source.to_string(),
        records: records.len() as u64,
        ..Default::default()
    };
    let checkpoint = backend.state.checkpoint(source).await?;
    let (behind, ahead): (Vec<&EsmRecord>, Vec<&EsmRecord>) = records
        .iter()
        .partition(|r| r.offset < checkpoint.next_offset);
    if let Some(first) = ahead.iter().map(|r| r.offset).min()
        && first > checkpoint.next_offset
        && !options.after_gap
    {
        // Landing it would move the checkpoint past offsets that have not landed yet, which
        // the event source would then deliver as already seen: lost.
        return Err(Error::Config(format!(
            "replay of {source}: the batch starts at offset {first}, past the partition's checkpoint {}: offsets {}..={} have not landed yet, and landing this batch first would make them read as already seen; let the event source deliver them (or replay the batches that hold them) first, then replay this one; if they will never be delivered (Kafka's own gaps: a transaction's marker, compacted records), replay with --after-gap",
            checkpoint.next_offset,
            checkpoint.next_offset,
            first - 1
        )));
    }
    if !ahead.is_empty() {
        let event = sub_event(source, &ahead);
        let s = ingestor.handle(&event).await?;
        report.already_landed += s.already_seen;
        report.accepted += s.accepted;
        report.dead_lettered += s.dead_lettered;
    }
    if behind.is_empty() {
        return Ok(report);
    }
    // A topic without a table of its own whose records feed windows or dedup: whether a record
    // below the checkpoint landed cannot be told (a window's partial row carries a batch's last
    // offset, a dedup may have dropped it), and landing it again would count it twice.
    if let Some(t) = spec.table_for_topic(&source.topic)
        && !t.land
        && spec
            .derived_from(&t.name)
            .any(|d| d.view.is_some() || d.dedup.is_some())
    {
        return Err(Error::Config(format!(
            "replay of {source}: {} records are below the checkpoint, and topic {} has no table of its own (land = false) while it feeds windowed or dedup tables, so which of them landed cannot be told; set land = true on table {} to make such topics replayable, or land them by hand",
            behind.len(),
            source.topic,
            t.name
        )));
    }
    let lo = behind.iter().map(|r| r.offset).min().unwrap_or(0);
    let hi = behind.iter().map(|r| r.offset).max().unwrap_or(0);
    let landed = landed_offsets(backend, spec, tables, source, lo, hi).await?;
    let missing: Vec<&EsmRecord> = behind
        .into_iter()
        .filter(|r| !landed.contains(&r.offset))
        .collect();
    report.already_landed += records.len() as u64 - ahead.len() as u64 - missing.len() as u64;
    if missing.is_empty() {
        return Ok(report);
    }
    match ingestor
        .land_replayed(source, &missing, lock, holder)
        .await?
    {
        Some(s) => {
            report.accepted += s.accepted;
            report.dead_lettered += s.dead_lettered;
            tracing::info!(source = %source, accepted = s.accepted, dead_lettered = s.dead_lettered,
                already_landed = report.already_landed, "replayed records that had never landed");
            Ok(report)
        }
        None => Err(Error::State {
            op: "replay",
            message: format!(
                "the replay lock of {source} expired and was taken over; nothing was recorded, run the replay again"
            ),
            retryable: true,
        }),
    }
}

fn sub_event(source: &SourcePartition, records: &[&EsmRecord]) -> EsmEvent {
    EsmEvent {
        records: BTreeMap::from([(
            source.to_string(),
            records.iter().map(|r| (*r).clone()).collect(),
        )]),
        ..Default::default()
    }
}

/// Offsets in `lo..=hi` of `source` that landed: in a pending batch, in the topic's table or in
/// `dead_letters`. Pending batches are read first (see the module documentation).
pub async fn landed_offsets(
    backend: &Backend,
    spec: &PipelineSpec,
    tables: &TableSet,
    source: &SourcePartition,
    lo: i64,
    hi: i64,
) -> Result<BTreeSet<i64>> {
    let mut landed = BTreeSet::new();
    let mut pending_ranges = Vec::new();
    for b in backend.state.pending_complete().await? {
        for r in b.ranges() {
            if r.source == *source && r.first_offset <= hi && r.last_offset >= lo {
                pending_ranges.push((r.first_offset, r.last_offset));
            }
        }
    }
    let mut names = vec![DEAD_LETTER_TABLE.to_string()];
    if let Some(t) = spec.table_for_topic(&source.topic) {
        if t.land {
            names.push(t.name.clone());
        } else {
            // A topic with no table of its own (`land = false`): its records are in the derived
            // tables that take rows one by one, under their own Kafka coordinates. A record
            // none of them kept (a filter) yields nothing when it is landed again. Windowed
            // tables' partial rows carry a batch's last offset, not each record's.
            names.extend(
                spec.derived_from(&t.name)
                    .filter(|d| d.view.is_none())
                    .map(|d| d.table.name.clone()),
            );
        }
    }
    for name in names {
        let Some((table, _)) = backend.catalog.load(&tables.ident(&name)).await? else {
            continue;
        };
        let dead = name == DEAD_LETTER_TABLE;
        for f in crate::table::files::load_current(&table).await?.live() {
            let df = f.entry.data_file();
            if may_hold(&table, df, source.partition, lo, hi) {
                read_offsets(&table, df, source, dead, lo, hi, &mut landed).await?;
            }
        }
    }
    for (first, last) in pending_ranges {
        landed.extend(first.max(lo)..=last.min(hi));
    }
    Ok(landed)
}

/// Whether a file's column bounds allow rows of `partition` with offsets in `lo..=hi`.
fn may_hold(table: &iceberg::table::Table, f: &DataFile, partition: i32, lo: i64, hi: i64) -> bool {
    let schema = table.metadata().current_schema();
    let id = |name: &str| schema.field_by_name(name).map(|c| c.id);
    let bound = |m: &std::collections::HashMap<i32, Datum>, name: &str| {
        id(name).and_then(|i| m.get(&i)).map(|d| match d.literal() {
            PrimitiveLiteral::Int(v) => i64::from(*v),
            PrimitiveLiteral::Long(v) => *v,
            _ => 0,
        })
    };
    let within = |name: &str, a: i64, b: i64| {
        let lower = bound(f.lower_bounds(), name).unwrap_or(i64::MIN);
        let upper = bound(f.upper_bounds(), name).unwrap_or(i64::MAX);
        lower <= b && upper >= a
    };
    within(
        crate::kafka::PARTITION,
        i64::from(partition),
        i64::from(partition),
    ) && within(crate::kafka::OFFSET, lo, hi)
}

/// Adds the offsets of `source` in `lo..=hi` found in one data file.
async fn read_offsets(
    table: &iceberg::table::Table,
    f: &DataFile,
    source: &SourcePartition,
    dead_letters: bool,
    lo: i64,
    hi: i64,
    out: &mut BTreeSet<i64>,
) -> Result<()> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, Int64Type};
    let path = f.file_path();
    let pq = |e: parquet::errors::ParquetError| Error::Internal(format!("read {path}: {e}"));
    let builder = crate::table::files::open_parquet(table, path, f.file_size_in_bytes()).await?;
    let mut wanted = vec![crate::kafka::PARTITION, crate::kafka::OFFSET];
    if dead_letters {
        wanted.push("topic");
    }
    let mask = ProjectionMask::columns(builder.parquet_schema(), wanted);
    let mut stream = builder.with_projection(mask).build().map_err(pq)?;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(pq)?;
        let (Some(p), Some(o)) = (
            batch.column_by_name(crate::kafka::PARTITION),
            batch.column_by_name(crate::kafka::OFFSET),
        ) else {
            return Err(Error::Internal(format!("{path} has no Kafka coordinates")));
        };
        let p = p.as_primitive::<Int32Type>();
        let o = o.as_primitive::<Int64Type>();
        let topic = batch.column_by_name("topic").map(|t| t.as_string::<i32>());
        for i in 0..batch.num_rows() {
            let same_topic = topic.is_none_or(|t| !t.is_null(i) && t.value(i) == source.topic);
            let offset = o.value(i);
            if same_topic && p.value(i) == source.partition && (lo..=hi).contains(&offset) {
                out.insert(offset);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT: &str = r#"{"eventSource":"aws:kafka","records":{"orders-0":[{"topic":"orders","partition":0,"offset":5,"timestamp":1,"value":"e30="}]}}"#;

    #[test]
    fn reads_s3_failure_records_and_plain_events() {
        let record = serde_json::json!({
            "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 11},
            "responseContext": {"statusCode": 200, "functionError": "Unhandled"},
            "version": "1.0",
            "KafkaBatchInfo": {"batchSize": 1},
            "payload": EVENT,
        });
        let from_s3 = parse_failed_batch(record.to_string().as_bytes(), "s3").expect("record");
        let plain = parse_failed_batch(EVENT.as_bytes(), "file").expect("event");
        assert_eq!(from_s3, plain);
        assert_eq!(plain.records["orders-0"][0].offset, 5);
    }

    #[test]
    fn a_record_without_payload_says_where_the_records_are() {
        let record = serde_json::json!({
            "requestContext": {"condition": "MaximumPayloadSizeExceeded"},
            "responseContext": null,
            "KafkaBatchInfo": {"recordsInfo": {"orders-0": {"firstRecordOffset": "5"}}},
        });
        let err =
            parse_failed_batch(record.to_string().as_bytes(), "s3://b/k").expect_err("no payload");
        assert!(err.to_string().contains("firstRecordOffset"), "{err}");
        assert!(parse_failed_batch(b"[1]", "x").is_err());
    }
}
