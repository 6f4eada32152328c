//! From the new records of a topic-partition to Arrow rows: accepted rows in the topic's
//! table's builder, dead letters for everything else.

use crate::esm::EsmRecord;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::TopicTable;
use super::tombstones::KeyDeletes;
use crate::checkpoint::SourcePartition;
use crate::decode::avro::AvroChange;
use crate::decode::debezium::{self, Change};
use crate::decode::value::{TIME_RANGE, timestamp_in_range};
use crate::decode::{DeadLetter, DeadLetterBuilder, Decoder, RejectKind, Rejection, RowBuilder};
use crate::kafka::RecordMeta;
use crate::spec::Envelope;

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
    /// Tombstones of upsert tables taken as deletes of their keys.
    pub key_deletes: u64,
    /// Records derived tables dead-lettered (they landed in their topic's table).
    pub derived_rejected: u64,
    pub derived_rejected_by_kind: Vec<(RejectKind, u64)>,
}

impl Counts {
    pub(super) fn reject(&mut self, kind: RejectKind) {
        self.rejected += 1;
        match self.rejected_by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.rejected_by_kind.push((kind, 1)),
        }
    }

    /// A record a derived table dead-lettered.
    pub(super) fn reject_derived(&mut self, kind: RejectKind) {
        self.derived_rejected += 1;
        match self
            .derived_rejected_by_kind
            .iter_mut()
            .find(|(k, _)| *k == kind)
        {
            Some((_, n)) => *n += 1,
            None => self.derived_rejected_by_kind.push((kind, 1)),
        }
    }
}

/// Decodes `records` of `source` (already filtered by the checkpoint, in offset order) into
/// `rows` (the table's builder, `None` for a topic no table is fed from), `keys` (an upsert
/// table's tombstones) and `dead`.
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_records(
    table: Option<&TopicTable>,
    mut rows: Option<&mut RowBuilder>,
    mut keys: Option<&mut KeyDeletes>,
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
            keys.as_deref_mut(),
        );
        match outcome {
            Ok(Decoded::Row) => counts.accepted += 1,
            Ok(Decoded::KeyDelete) => counts.key_deletes += 1,
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

/// What became of a record.
enum Decoded {
    /// A row of its table.
    Row,
    /// A tombstone of an upsert table: a delete of its key.
    KeyDelete,
}

/// Decodes one record into `rows` (or, a tombstone of an upsert table, into `keys`), or says
/// why it cannot be.
fn decode_one(
    table: Option<&TopicTable>,
    record: &EsmRecord,
    partition: i32,
    max_record_bytes: usize,
    buffers: Buffers<'_>,
    rows: Option<&mut RowBuilder>,
    keys: Option<&mut KeyDeletes>,
) -> Result<Decoded, Rejection> {
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
        let Some(keys) = keys else {
            return Err(Rejection::new(
                RejectKind::Tombstone,
                "value is absent (tombstone)",
            ));
        };
        if key.is_some_and(|k| k.len() > max_record_bytes) {
            return Err(Rejection::new(
                RejectKind::Oversize,
                format!(
                    "the tombstone's key is over the limit of {max_record_bytes} bytes (max_record_bytes)"
                ),
            ));
        }
        keys.append(RecordMeta {
            partition,
            offset: record.offset,
            timestamp_us,
            key,
            headers: &record.headers,
        })?;
        return Ok(Decoded::KeyDelete);
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
    // A table that keeps the headers stores them too: they count toward the limit.
    if table.spec.kafka_headers {
        let headers: usize = record
            .headers
            .iter()
            .map(|h| h.key.len() + h.value.as_ref().map_or(0, Vec::len))
            .sum();
        if value_buf.len() + headers > max_record_bytes {
            return Err(Rejection::new(
                RejectKind::Oversize,
                format!(
                    "value and headers are {} bytes ({headers} of headers), over the limit of \
                     {max_record_bytes} (max_record_bytes)",
                    value_buf.len() + headers
                ),
            ));
        }
    }
    // A Debezium change event: `after` is the row, a delete names its key.
    if table
        .spec
        .upsert
        .as_ref()
        .is_some_and(|u| u.envelope == Some(Envelope::Debezium))
    {
        let meta = RecordMeta {
            partition,
            offset: record.offset,
            timestamp_us,
            key,
            headers: &record.headers,
        };
        if let Decoder::Avro(avro) = &table.decoder {
            let delete = match avro.change(value_buf, scratch, max_record_bytes)? {
                AvroChange::Upsert(cells) => {
                    rows.append(&cells, meta);
                    return Ok(Decoded::Row);
                }
                AvroChange::Delete(key) => key,
            };
            let keys = keys.ok_or_else(|| {
                Rejection::new(RejectKind::Envelope, "a delete on a table without a key")
            })?;
            match delete {
                Some(cells) => keys.rows.append(&cells, meta),
                None => keys.append(meta).map_err(|from_key| {
                    Rejection::new(
                        RejectKind::Envelope,
                        format!(
                            "Debezium delete: its key is neither in before nor in the Kafka key ({})",
                            from_key.message
                        ),
                    )
                })?,
            }
            return Ok(Decoded::KeyDelete);
        }
        match debezium::change(value_buf)? {
            Change::Upsert(row) => {
                value_buf.clear();
                value_buf.extend_from_slice(row.as_bytes());
            }
            Change::Delete(before) => {
                let keys = keys.ok_or_else(|| {
                    Rejection::new(RejectKind::Envelope, "a delete on a table without a key")
                })?;
                match before {
                    Some(object) => keys.append_object(&object, meta)?,
                    None => keys.append(meta)?,
                }
                return Ok(Decoded::KeyDelete);
            }
        }
    }
    let cells = table.decoder.decode(value_buf, scratch, max_record_bytes)?;
    rows.append(
        &cells,
        RecordMeta {
            partition,
            offset: record.offset,
            timestamp_us,
            key,
            headers: &record.headers,
        },
    );
    Ok(Decoded::Row)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow_array::cast::AsArray;
    use arrow_array::{Array, RecordBatch};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use crate::backend::{Backend, BackendConfig};
    use crate::esm::EsmEvent;
    use crate::ingest::Ingestor;
    use crate::kafka;
    use crate::spec::PipelineSpec;
    use crate::table::encode::EncodedFile;
    use crate::tables::TableSet;

    /// A topic's table with `kafka_headers` as `headers` says, and a derived table over it that
    /// does not select them.
    fn spec(headers: bool) -> PipelineSpec {
        let text = format!(
            r#"
[[tables]]
name = "orders"
topic = "orders"
kafka_headers = {headers}
columns = [{{ name = "id", type = "string", required = true }}]

[[derived_tables]]
name = "orders_upper"
sql = "SELECT id, upper(id) AS big FROM orders"
"#
        );
        PipelineSpec::parse(&text, Path::new("p.toml"), &crate::process::Planner).expect("spec")
    }

    /// Three records: two headers under one key and one without a value; none; one.
    fn event() -> EsmEvent {
        use base64::Engine as _;
        let value = |id: &str| {
            base64::engine::general_purpose::STANDARD.encode(format!(r#"{{"id":"{id}"}}"#))
        };
        serde_json::from_str(&format!(
            r#"{{"records":{{"orders-0":[
              {{"topic":"orders","partition":0,"offset":0,"timestamp":1,"value":"{}",
                "headers":[{{"trace":[97]}},{{"trace":[98,99]}},{{"empty":null}}]}},
              {{"topic":"orders","partition":0,"offset":1,"timestamp":1,"value":"{}"}},
              {{"topic":"orders","partition":0,"offset":2,"timestamp":1,"value":"{}",
                "headers":[{{"source":[119,101,98]}}]}}
            ]}}}}"#,
            value("a"),
            value("b"),
            value("c")
        ))
        .expect("event")
    }

    /// The rows of the files of `table`, read back from their Parquet bytes.
    fn rows(files: &[EncodedFile], table: &str) -> Vec<RecordBatch> {
        files
            .iter()
            .filter(|f| f.table == table)
            .flat_map(|f| {
                ParquetRecordBatchReaderBuilder::try_new(f.bytes.clone())
                    .expect("parquet")
                    .build()
                    .expect("reader")
                    .map(|b| b.expect("batch"))
            })
            .collect()
    }

    /// Each row's headers: `None` for NULL, else (key, value) in order.
    type Headers = Option<Vec<(String, Option<Vec<u8>>)>>;

    fn headers(batch: &RecordBatch) -> Vec<Headers> {
        let list = batch
            .column_by_name(kafka::HEADERS)
            .expect("kafka_headers")
            .as_list::<i32>();
        (0..list.len())
            .map(|i| {
                list.is_valid(i).then(|| {
                    let entries = list.value(i);
                    let entries = entries.as_struct();
                    let keys = entries.column(0).as_string::<i32>();
                    let values = entries.column(1).as_binary::<i64>();
                    (0..entries.len())
                        .map(|j| {
                            let value = values.is_valid(j).then(|| values.value(j).to_vec());
                            (keys.value(j).to_string(), value)
                        })
                        .collect()
                })
            })
            .collect()
    }

    #[tokio::test]
    async fn headers_land_in_order_and_derived_tables_still_run() {
        let home = tempfile::tempdir().expect("tempdir");
        let backend = Backend::connect(&BackendConfig::Embedded {
            home: home.path().to_path_buf(),
        })
        .await
        .expect("backend");
        let ingestor = Ingestor::new(&spec(true), &backend).expect("ingestor");
        let (records, files) = ingestor.encode_event(&event()).await.expect("encode");
        assert_eq!(records, 3);
        let orders = rows(&files, "orders");
        assert_eq!(orders.len(), 1);
        let schema = orders[0].schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names[names.len() - 2..],
            [kafka::KEY_BYTES, kafka::HEADERS],
            "{names:?}"
        );
        let h = |k: &str, v: Option<&[u8]>| (k.to_string(), v.map(<[u8]>::to_vec));
        assert_eq!(
            headers(&orders[0]),
            [
                Some(vec![
                    h("trace", Some(b"a")),
                    h("trace", Some(b"bc")),
                    h("empty", None)
                ]),
                Some(vec![]),
                Some(vec![h("source", Some(b"web"))]),
            ]
        );
        // The derived table runs over the same rows, without the headers.
        let upper = rows(&files, "orders_upper");
        assert_eq!(upper.iter().map(RecordBatch::num_rows).sum::<usize>(), 3);
        assert!(upper[0].column_by_name(kafka::HEADERS).is_none());
        assert!(upper[0].column_by_name(kafka::OFFSET).is_some());
    }

    #[tokio::test]
    async fn headers_count_toward_max_record_bytes_where_the_table_keeps_them() {
        use crate::esm::{EsmEvent, EsmHeader, EsmRecord};
        use base64::Engine as _;
        let big = EsmRecord {
            topic: Some("orders".into()),
            partition: 0,
            offset: 1,
            timestamp: 1_796_037_119_142,
            value: Some(base64::engine::general_purpose::STANDARD.encode(br#"{"id":"o-1"}"#)),
            headers: vec![EsmHeader {
                key: "blob".into(),
                value: Some(vec![7; 2 * 1024 * 1024]),
            }],
            ..Default::default()
        };
        let event = EsmEvent {
            records: [("orders-0".to_string(), vec![big])].into_iter().collect(),
            ..Default::default()
        };
        for (keeps, dead) in [(true, 1), (false, 0)] {
            let dir = tempfile::tempdir().expect("tempdir");
            let backend =
                crate::backend::Backend::connect(&crate::backend::BackendConfig::Embedded {
                    home: dir.path().to_path_buf(),
                })
                .await
                .expect("backend");
            let ingestor = crate::ingest::Ingestor::connect(&spec(keeps), &backend)
                .await
                .expect("ingestor");
            let s = ingestor.handle(&event).await.expect("landed");
            assert_eq!(s.dead_lettered, dead, "keeps headers: {keeps}: {s:?}");
        }
    }

    #[tokio::test]
    async fn a_table_that_keeps_its_headers_column_gets_null_once_the_option_is_off() {
        let home = tempfile::tempdir().expect("tempdir");
        let backend = Backend::connect(&BackendConfig::Embedded {
            home: home.path().to_path_buf(),
        })
        .await
        .expect("backend");
        let on = spec(true);
        TableSet::new(&on, &backend.namespace)
            .expect("tables")
            .ensure_all(&backend)
            .await
            .expect("created with the headers");
        let off = spec(false);
        let ingestor = Ingestor::connect(&off, &backend).await.expect("ingestor");
        assert!(!ingestor.has_refused());
        let (_, files) = ingestor.encode_event(&event()).await.expect("encode");
        let orders = rows(&files, "orders");
        assert_eq!(headers(&orders[0]), [None, None, None]);
        // The file carries the table's ids (the column kept, after the five).
        let id = |name: &str| {
            orders[0]
                .schema()
                .field_with_name(name)
                .expect(name)
                .metadata()
                .get("PARQUET:field_id")
                .cloned()
        };
        assert_eq!(id(kafka::HEADERS).as_deref(), Some("7"));
        let upper = rows(&files, "orders_upper");
        assert_eq!(upper.iter().map(RecordBatch::num_rows).sum::<usize>(), 3);
    }
}
