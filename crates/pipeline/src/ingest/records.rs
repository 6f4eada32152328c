//! From the new records of a topic-partition to Arrow rows: accepted rows in the topic's
//! table's builder, dead letters for everything else.

use crate::esm::EsmRecord;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::TopicTable;
use crate::checkpoint::SourcePartition;
use crate::decode::value::{TIME_RANGE, timestamp_in_range};
use crate::decode::{DeadLetter, DeadLetterBuilder, RejectKind, Rejection, RowBuilder};
use crate::kafka::RecordMeta;

/// Counts of one decoding pass.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub accepted: u64,
    pub rejected: u64,
    pub rejected_by_kind: Vec<(RejectKind, u64)>,
    /// Rows written to derived tables.
    pub derived_rows: u64,
    /// Rows a derived table's dedup dropped.
    pub deduplicated: u64,
}

impl Counts {
    pub(super) fn reject(&mut self, kind: RejectKind) {
        self.rejected += 1;
        match self.rejected_by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.rejected_by_kind.push((kind, 1)),
        }
    }
}

/// Decodes `records` of `source` (already filtered by the checkpoint, in offset order) into
/// `rows` (the table's builder, `None` for a topic no table is fed from) and `dead`.
pub(super) fn decode_records(
    table: Option<&TopicTable>,
    mut rows: Option<&mut RowBuilder>,
    records: &[&EsmRecord],
    source: &SourcePartition,
    max_record_bytes: usize,
    dead: &mut DeadLetterBuilder,
    counts: &mut Counts,
) {
    let mut value_buf = Vec::new();
    let mut key_buf = Vec::new();
    let mut scratch = Vec::new();
    for record in records {
        let partition = source.partition;
        let outcome = decode_one(
            table,
            record,
            partition,
            max_record_bytes,
            Buffers {
                value: &mut value_buf,
                key: &mut key_buf,
                scratch: &mut scratch,
            },
            rows.as_deref_mut(),
        );
        match outcome {
            Ok(()) => counts.accepted += 1,
            Err(rejection) => {
                dead_letter(
                    record,
                    source,
                    &rejection,
                    dead,
                    &mut value_buf,
                    &mut key_buf,
                );
                counts.reject(rejection.kind);
            }
        }
    }
}

/// Appends `record` of `source` to `dead` as rejected for `rejection`, with its key and value
/// decoded from base64 where they can be (else as received).
pub(super) fn dead_letter(
    record: &EsmRecord,
    source: &SourcePartition,
    rejection: &Rejection,
    dead: &mut DeadLetterBuilder,
    value_buf: &mut Vec<u8>,
    key_buf: &mut Vec<u8>,
) {
    let key_ok = record
        .key
        .as_deref()
        .map(|k| STANDARD.decode_vec(k, key_buf.clear_and()).is_ok());
    let key: Option<&[u8]> = match (record.key.as_deref(), key_ok) {
        (Some(_), Some(true)) => Some(key_buf),
        (Some(raw), _) => Some(raw.as_bytes()),
        (None, _) => None,
    };
    let value_ok = record
        .value
        .as_deref()
        .map(|v| STANDARD.decode_vec(v, value_buf.clear_and()).is_ok());
    let value: Option<&[u8]> = match (record.value.as_deref(), value_ok) {
        (Some(_), Some(true)) => Some(value_buf),
        (Some(raw), _) => Some(raw.as_bytes()),
        (None, _) => None,
    };
    dead.append(&DeadLetter {
        topic: &source.topic,
        partition: source.partition,
        offset: record.offset,
        timestamp_ms: Some(record.timestamp),
        key,
        value,
        kind: rejection.kind,
        message: &rejection.message,
    });
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

/// Reused buffers of one decoding pass.
struct Buffers<'b> {
    value: &'b mut Vec<u8>,
    key: &'b mut Vec<u8>,
    /// A decompressed body.
    scratch: &'b mut Vec<u8>,
}

/// Decodes one record into `rows`, or says why it cannot be.
fn decode_one(
    table: Option<&TopicTable>,
    record: &EsmRecord,
    partition: i32,
    max_record_bytes: usize,
    buffers: Buffers<'_>,
    rows: Option<&mut RowBuilder>,
) -> Result<(), Rejection> {
    let Buffers {
        value: value_buf,
        key: key_buf,
        scratch,
    } = buffers;
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
    let cells = table.decoder.decode(value_buf, scratch, max_record_bytes)?;
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
