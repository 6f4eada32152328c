//! Tombstones of an upsert table's topic (a record with a key and no value): each one becomes a
//! row of the batch's *key delete file* — the table's key columns, read from the Kafka key, and
//! the Kafka columns — which the commit stage applies as a delete of the key's live row (see
//! [`crate::upsert`]). The file carries the table's own field ids, so that the commit reads and
//! hashes its keys exactly as it reads the table's rows.
//!
//! The key is read as JSON: an object holding the key's columns, read by their paths as the
//! value is (`{"order_id": "o-1"}`, what Kafka Connect and Debezium write; Kafka Connect's
//! `{"schema": …, "payload": …}` wrapper is read by its payload), or — for a key of one column —
//! a JSON scalar or the key's
//! text as it is (`o-1`; for a string column any text that is not a JSON string or object, so
//! that `12345` is the string a producer's string serializer sent). On an Avro topic a
//! registry-framed key (Confluent's or Glue's wire format: a record of the key's columns, as
//! Debezium's AvroConverter writes it) is read with its schema from the registry. A tombstone
//! whose key cannot be read stays a dead letter that says why.

use std::sync::Arc;

use iceberg::spec::{PartitionSpec, Schema};

use crate::decode::avro::AvroDecoder;
use crate::decode::framing::frame;
use crate::decode::{RecordDecoder, RejectKind, Rejection, RowBuilder};

/// The most bytes a compressed (Glue zlib) registry-framed key inflates to.
const MAX_FRAMED_KEY_BYTES: usize = 1 << 20;
use crate::error::{Error, Result};
use crate::kafka::{self, RecordMeta};
use crate::schema::TableLayout;
use crate::spec::{ColumnType, TableSpec};

/// The tombstones of one upsert table in one batch.
pub(super) struct KeyDeletes {
    /// The layout of the key delete file (key columns, then the Kafka columns; unpartitioned).
    pub layout: Arc<TableLayout>,
    /// The rows so far.
    pub rows: RowBuilder,
    decoder: RecordDecoder,
    /// The path of the key's column when it has one (a bare key is its value), and whether it
    /// is a string.
    single: Option<(Vec<String>, bool)>,
    /// For an Avro topic: the decoder of its registry-framed keys.
    framed: Option<Arc<AvroDecoder>>,
}

/// The spec of an upsert table's key: its key columns (required), read by their paths, from a
/// key as from a value; `None` for a table that is not an upsert table.
pub(super) fn key_spec(spec: &TableSpec) -> Result<Option<TableSpec>> {
    let Some(upsert) = &spec.upsert else {
        return Ok(None);
    };
    let mut key_spec = spec.clone();
    key_spec.columns = upsert
        .key
        .iter()
        .map(|k| {
            let mut c = spec
                .columns
                .iter()
                .find(|c| &c.name == k)
                .cloned()
                .ok_or_else(|| {
                    Error::Config(format!(
                        "table {}: key deletes: no key column {k:?}",
                        spec.name
                    ))
                })?;
            c.required = true;
            Ok(c)
        })
        .collect::<Result<_>>()?;
    key_spec.kafka_headers = false;
    key_spec.upsert = None;
    Ok(Some(key_spec))
}

/// The decoder of an Avro upsert table's registry-framed keys (Confluent's or Glue's wire
/// format, the key's schema from the registry: a record of the key's columns, as Debezium's
/// AvroConverter writes it).
pub(super) fn framed_keys(spec: &TableSpec) -> Result<Option<Arc<AvroDecoder>>> {
    if spec.format != crate::spec::Format::Avro {
        return Ok(None);
    }
    Ok(key_spec(spec)?.map(|k| Arc::new(AvroDecoder::new(&k))))
}

impl KeyDeletes {
    /// A builder of `spec`'s key deletes with the table's `layout` (its field ids), or `None`
    /// when the table is not an upsert table.
    pub fn new(spec: &TableSpec, layout: &TableLayout, capacity: usize) -> Result<Option<Self>> {
        let (Some(upsert), Some(key_spec)) = (&spec.upsert, key_spec(spec)?) else {
            return Ok(None);
        };
        let ctx = |what: String| Error::Config(format!("table {}: key deletes: {what}", spec.name));
        let fields = upsert
            .key
            .iter()
            .map(String::as_str)
            .chain(kafka::NAMES)
            .map(|name| {
                layout
                    .schema
                    .field_by_name(name)
                    .cloned()
                    .ok_or_else(|| ctx(format!("the table has no column {name:?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = Schema::builder()
            .with_schema_id(0)
            .with_fields(fields)
            .build()
            .map_err(|e| ctx(format!("schema: {e}")))?;
        let layout = Arc::new(TableLayout::of_table(
            &spec.name,
            Arc::new(schema),
            Arc::new(PartitionSpec::unpartition_spec()),
        )?);
        Ok(Some(KeyDeletes {
            rows: RowBuilder::new(&key_spec, layout.clone(), capacity)?,
            layout,
            decoder: RecordDecoder::new(&key_spec),
            single: match key_spec.columns.as_slice() {
                [c] => Some((c.path.0.clone(), c.column_type == ColumnType::String)),
                _ => None,
            },
            framed: None,
        }))
    }

    /// Reads registry-framed keys with `decoder` (an Avro topic's: [`framed_keys`]).
    pub fn with_framed_keys(mut self, decoder: Option<Arc<AvroDecoder>>) -> Self {
        self.framed = decoder;
        self
    }

    /// Adds a delete of the key whose columns are in the JSON `object` (a Debezium delete's
    /// `before`), at `meta`'s Kafka position, or says why the key cannot be read.
    ///
    /// When `object` lacks the key (its columns null or absent, as a source's replica identity
    /// may leave them), the Kafka key is read instead.
    pub fn append_object(
        &mut self,
        object: &str,
        meta: RecordMeta<'_>,
    ) -> std::result::Result<(), Rejection> {
        match self.decoder.decode(object) {
            Ok(cells) => {
                self.rows.append(&cells, meta);
                Ok(())
            }
            Err(from_before) => self.append(meta).map_err(|from_key| {
                Rejection::new(
                    RejectKind::Envelope,
                    format!(
                        "Debezium delete: its key is neither in before ({}) nor in the Kafka key ({})",
                        from_before.message, from_key.message
                    ),
                )
            }),
        }
    }

    /// Adds the tombstone of `meta` (whose `key` is the record's key), or says why its key
    /// cannot be read.
    pub fn append(&mut self, meta: RecordMeta<'_>) -> std::result::Result<(), Rejection> {
        let bad = |why: String| {
            Rejection::new(
                RejectKind::Tombstone,
                format!("tombstone of an upsert table: {why}"),
            )
        };
        let Some(key) = meta.key else {
            return Err(bad(
                "the record has no key, so no row to delete (value absent)".into(),
            ));
        };
        let mut framed_error = None;
        if let Some(decoder) = &self.framed
            && frame(key).is_ok()
        {
            let mut scratch = Vec::new();
            match decoder.decode(key, &mut scratch, MAX_FRAMED_KEY_BYTES) {
                Ok(cells) => {
                    self.rows.append(&cells, meta);
                    return Ok(());
                }
                // Text that only looks framed is read as text below; else this is the reason.
                Err(r) => framed_error = Some(r.message),
            }
        }
        let bad = |why: String| match &framed_error {
            Some(framed) => bad(format!("its key cannot be read: {framed}")),
            None => bad(why),
        };
        if key.first() == Some(&0) {
            return Err(bad(
                "its key is registry-framed (Confluent wire format), which is read only on an Avro topic (format = \"avro\"); produce keys as JSON or text".into(),
            ));
        }
        let text = std::str::from_utf8(key)
            .map_err(|_| bad("its key is not UTF-8 text (keys are read as JSON or text)".into()))?;
        use serde_json::Value;
        let object;
        let parsed = match serde_json::from_str::<Value>(text) {
            Ok(v) => Some(crate::decode::debezium::key_payload(v)),
            // JSON nested past the parser's limit is no key, whatever the column: say so
            // rather than read it as the column's text.
            Err(e) if e.to_string().contains("recursion limit") => {
                return Err(bad(
                    "its key is JSON nested more than 128 levels deep; a key is a JSON object of the key's columns, or a column's value"
                        .into(),
                ));
            }
            Err(_) => None,
        };
        let json = match (parsed, &self.single) {
            // Kafka Connect's JSON converter wraps the key with its schema: the payload is it.
            (Some(v @ Value::Object(_)), _) => {
                object = v.to_string();
                &object
            }
            (Some(v @ Value::String(_)), Some((path, _))) => {
                object = at_path(path, v).to_string();
                &object
            }
            // A string key: any other text is the string itself (`12345`, `true`).
            (_, Some((path, true))) | (None, Some((path, false))) => {
                object = at_path(path, Value::String(text.to_string())).to_string();
                &object
            }
            (Some(v), Some((path, false))) if !v.is_array() && !v.is_null() => {
                object = at_path(path, v).to_string();
                &object
            }
            _ => {
                return Err(bad(format!(
                    "its key {text:?} is not a JSON object of the key's columns"
                )));
            }
        };
        let cells = self
            .decoder
            .decode(json)
            .map_err(|r| bad(format!("its key cannot be read: {}", r.message)))?;
        self.rows.append(&cells, meta);
        Ok(())
    }
}

/// `value` at `path` (`["a", "b"]`: `{"a": {"b": value}}`).
fn at_path(path: &[String], value: serde_json::Value) -> serde_json::Value {
    path.iter().rev().fold(value, |inner, member| {
        let mut m = serde_json::Map::new();
        m.insert(member.clone(), inner);
        serde_json::Value::Object(m)
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    use super::*;
    use crate::spec::PipelineSpec;

    fn spec(key: &str) -> TableSpec {
        let text = format!(
            r#"
[[tables]]
name = "accounts"
topic = "accounts"
mode = "upsert"
primary_key = {key}
columns = [
  {{ name = "region", type = "string", required = true, path = "$.where.region" }},
  {{ name = "id", type = "long", required = true }},
  {{ name = "balance", type = "double" }},
]
"#
        );
        PipelineSpec::parse(&text, Path::new("p.toml"), &crate::process::Planner)
            .expect("spec")
            .tables
            .remove(0)
    }

    fn meta(key: Option<&[u8]>) -> RecordMeta<'_> {
        RecordMeta {
            partition: 3,
            offset: 41,
            timestamp_us: 7,
            key,
            headers: &[],
        }
    }

    #[test]
    fn a_key_is_read_as_an_object_a_scalar_or_its_text() {
        let t = spec(r#"["id"]"#);
        let layout = TableLayout::for_table(&t).expect("layout");
        let mut k = KeyDeletes::new(&t, &layout, 4)
            .expect("ok")
            .expect("upsert");
        for key in [&br#"{"id": 12, "other": true}"#[..], b"13", b" 14 "] {
            k.append(meta(Some(key))).expect("readable key");
        }
        let batch = k.rows.finish().expect("batch");
        let schema = batch.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names[0], "id");
        assert_eq!(&names[1..], kafka::NAMES);
        let ids: Vec<i64> = batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, [12, 13, 14]);
        // The table's own field ids (id is the table's second column).
        let field_id = batch
            .schema()
            .field(0)
            .metadata()
            .get("PARQUET:field_id")
            .cloned();
        assert_eq!(field_id.as_deref(), Some("2"));
    }

    #[test]
    fn an_unreadable_key_is_refused_saying_why() {
        let t = spec(r#"["region", "id"]"#);
        let layout = TableLayout::for_table(&t).expect("layout");
        let mut k = KeyDeletes::new(&t, &layout, 4)
            .expect("ok")
            .expect("upsert");
        // The key of two columns is read by the columns' paths, as the value is.
        k.append(meta(Some(br#"{"where":{"region":"eu"},"id":5}"#)))
            .expect("object key");
        for (key, why) in [
            (None, "no key"),
            (Some(&b"eu-5"[..]), "not a JSON object"),
            (Some(&br#"{"where":{"region":"eu"}}"#[..]), "cannot be read"),
            (Some(&br#"{"region":"eu","id":5}"#[..]), "cannot be read"),
            (
                Some(&br#"{"where":{"region":"eu"},"id":"x"}"#[..]),
                "cannot be read",
            ),
            (Some(&[0xff, 0xfe][..]), "not UTF-8"),
        ] {
            let err = k.append(meta(key)).expect_err("refused");
            assert_eq!(err.kind, RejectKind::Tombstone);
            assert!(err.message.contains(why), "{key:?}: {}", err.message);
        }
        assert_eq!(k.rows.len(), 1);
        let plain = spec(r#"["id"]"#);
        let mut plain = KeyDeletes::new(&plain, &TableLayout::for_table(&plain).expect("l"), 1)
            .expect("ok")
            .expect("upsert");
        assert!(
            plain.append(meta(Some(b"[1]"))).is_err(),
            "an array is no key"
        );
        assert!(plain.append(meta(Some(b"abc"))).is_err(), "not a long");
        // A key nested 100,000 levels deep is refused as such, not as a string for a long.
        let deep = "[".repeat(100_000);
        let err = plain
            .append(meta(Some(deep.as_bytes())))
            .expect_err("too deep");
        assert!(
            err.message.contains("nested more than 128 levels"),
            "{}",
            err.message
        );
        let framed = plain.append(meta(Some(&[0, 0, 0, 0, 5, 2, b'7'][..])));
        assert!(
            framed
                .expect_err("framed")
                .message
                .contains("registry-framed")
        );
    }

    #[test]
    fn a_string_key_is_the_text_a_string_serializer_sent() {
        let t = spec(r#"["region"]"#);
        let layout = TableLayout::for_table(&t).expect("layout");
        let mut k = KeyDeletes::new(&t, &layout, 4)
            .expect("ok")
            .expect("upsert");
        for key in [
            &b"12345"[..],
            b"true",
            b"\"eu\"",
            b"eu-west",
            br#"{"where":{"region":"us"}}"#,
            b"null",
        ] {
            k.append(meta(Some(key))).expect("a string key");
        }
        let batch = k.rows.finish().expect("batch");
        let regions: Vec<&str> = batch
            .column(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        assert_eq!(regions, ["12345", "true", "eu", "eu-west", "us", "null"]);
    }

    #[test]
    fn a_debezium_delete_reads_before_by_the_paths_or_else_the_kafka_key() {
        let t = spec(r#"["id"]"#);
        let layout = TableLayout::for_table(&t).expect("layout");
        let mut k = KeyDeletes::new(&t, &layout, 4)
            .expect("ok")
            .expect("upsert");
        k.append_object(r#"{"id": 7, "balance": null}"#, meta(Some(b"8")))
            .expect("before has the key");
        let wrapped = br#"{"schema": {"type": "struct"}, "payload": {"id": 9}}"#;
        k.append_object(r#"{"id": null}"#, meta(Some(wrapped)))
            .expect("the Kafka key has it");
        let err = k
            .append_object(r#"{"balance": 1.5}"#, meta(None))
            .expect_err("no key anywhere");
        assert_eq!(err.kind, RejectKind::Envelope);
        assert!(err.message.contains("neither in before"), "{}", err.message);
        let batch = k.rows.finish().expect("batch");
        let ids: Vec<i64> = batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, [7, 9]);
    }
}
