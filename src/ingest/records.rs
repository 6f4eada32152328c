//! From the ESM batch of one topic-partition to Arrow batches: accepted rows of the topic's
//! table, and dead letters for everything else.

use crate::esm::EsmRecord;
use arrow_array::RecordBatch;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::TopicTable;
use crate::checkpoint::SourcePartition;
use crate::decode::value::{TIME_RANGE, timestamp_in_range};
use crate::decode::{DeadLetter, DeadLetterBuilder, RecordMeta, RejectKind, Rejection, RowBuilder};
use crate::error::Result;

/// The decoded content of one partition's new records.
pub(super) struct Decoded {
    pub rows: Option<RecordBatch>,
    pub dead_letters: Option<RecordBatch>,
    pub accepted: u64,
    pub rejected: u64,
    pub rejected_by_kind: Vec<(RejectKind, u64)>,
}

/// Decodes `records` (already filtered by the checkpoint, in offset order).
pub(super) fn decode_records(
    table: Option<&TopicTable>,
    records: &[&EsmRecord],
    source: &SourcePartition,
    max_record_bytes: usize,
    dead: &mut DeadLetterBuilder,
) -> Result<Decoded> {
    let mut rows = match table {
        Some(t) => Some(RowBuilder::new(&t.spec, t.layout.clone(), records.len())?),
        None => None,
    };
    let mut value_buf = Vec::new();
    let mut key_buf = Vec::new();
    let mut counts: Vec<(RejectKind, u64)> = Vec::new();
    for record in records {
        let (topic, partition) = (source.topic.as_str(), source.partition);
        let outcome = decode_one(
            table,
            record,
            partition,
            max_record_bytes,
            &mut value_buf,
            &mut key_buf,
            rows.as_mut(),
        );
        if let Err(rejection) = outcome {
            let key_ok = record
                .key
                .as_deref()
                .map(|k| STANDARD.decode_vec(k, key_buf.clear_and()).is_ok());
            let key: Option<&[u8]> = match (record.key.as_deref(), key_ok) {
                (Some(_), Some(true)) => Some(&key_buf),
                (Some(raw), _) => Some(raw.as_bytes()),
                (None, _) => None,
            };
            let value_ok = record
                .value
                .as_deref()
                .map(|v| STANDARD.decode_vec(v, value_buf.clear_and()).is_ok());
            let value: Option<&[u8]> = match (record.value.as_deref(), value_ok) {
                (Some(_), Some(true)) => Some(&value_buf),
                (Some(raw), _) => Some(raw.as_bytes()),
                (None, _) => None,
            };
            dead.append(&DeadLetter {
                topic,
                partition,
                offset: record.offset,
                timestamp_ms: Some(record.timestamp),
                key,
                value,
                kind: rejection.kind,
                message: &rejection.message,
            });
            match counts.iter_mut().find(|(k, _)| *k == rejection.kind) {
                Some((_, n)) => *n += 1,
                None => counts.push((rejection.kind, 1)),
            }
        }
    }
    let rejected = counts.iter().map(|(_, n)| n).sum();
    let accepted = rows.as_ref().map_or(0, |r| r.len() as u64);
    let rows = match rows.as_mut() {
        Some(r) if !r.is_empty() => Some(r.finish()?),
        _ => None,
    };
    let dead_letters = if dead.is_empty() {
        None
    } else {
        Some(dead.finish()?)
    };
    Ok(Decoded {
        rows,
        dead_letters,
        accepted,
        rejected,
        rejected_by_kind: counts,
    })
}

trait ClearAnd {
    fn clear_and(&mut self) -> &mut Self;
}

impl ClearAnd for Vec<u8> {
    fn clear_and(&mut self) -> &mut Self {
        self.clear();
        self
    }
}

/// Decodes one record into `rows`, or says why it cannot be.
fn decode_one(
    table: Option<&TopicTable>,
    record: &EsmRecord,
    partition: i32,
    max_record_bytes: usize,
    value_buf: &mut Vec<u8>,
    key_buf: &mut Vec<u8>,
    rows: Option<&mut RowBuilder>,
) -> Result<(), Rejection> {
    let (Some(table), Some(rows)) = (table, rows) else {
        let topic = record.topic.as_deref().unwrap_or("(none)");
        return Err(Rejection::new(
            RejectKind::UnknownTopic,
            format!(
                "topic {topic:?} feeds no table in the pipeline spec; add a [[tables]] entry for it"
            ),
        ));
    };
    let key = match record.key.as_deref() {
        None => None,
        Some(k) => {
            STANDARD.decode_vec(k, key_buf.clear_and()).map_err(|e| {
                Rejection::new(
                    RejectKind::InvalidBase64,
                    format!("key is not valid base64: {e}"),
                )
            })?;
            Some(key_buf.as_slice())
        }
    };
    let timestamp_us = record
        .timestamp
        .checked_mul(1000)
        .and_then(|us| timestamp_in_range(us, "").ok())
        .ok_or_else(|| {
            Rejection::new(
                RejectKind::OutOfRange,
                format!(
                    "Kafka timestamp {} (epoch milliseconds) is outside {TIME_RANGE}",
                    record.timestamp
                ),
            )
        })?;
    let Some(raw) = record.value.as_deref() else {
        return Err(Rejection::new(
            RejectKind::Tombstone,
            "value is absent (tombstone)",
        ));
    };
    STANDARD
        .decode_vec(raw, value_buf.clear_and())
        .map_err(|e| {
            Rejection::new(
                RejectKind::InvalidBase64,
                format!("value is not valid base64: {e}"),
            )
        })?;
    if value_buf.is_empty() {
        return Err(Rejection::new(RejectKind::EmptyValue, "value is empty"));
    }
    if value_buf.len() > max_record_bytes {
        return Err(Rejection::new(
            RejectKind::Oversize,
            format!(
                "value is {} bytes, over the limit of {max_record_bytes} (max_record_bytes)",
                value_buf.len()
            ),
        ));
    }
    let json = std::str::from_utf8(value_buf)
        .map_err(|e| Rejection::new(RejectKind::InvalidUtf8, format!("value is not UTF-8: {e}")))?;
    let cells = table.decoder.decode(json)?;
    rows.append(
        &cells,
        RecordMeta {
            partition,
            offset: record.offset,
            timestamp_us,
            key,
        },
    );
    Ok(())
}
