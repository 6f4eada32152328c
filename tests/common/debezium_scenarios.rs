//! Change data capture (`envelope = "debezium"` on an upsert table): Debezium change events in
//! JSON (with and without the converter's schemas) and in Avro behind a registry (written by
//! fastavro with the envelope Debezium's AvroConverter registers) read back as the source
//! table's current rows through every reader.

use std::path::Path;

use serde_json::Value;
use streamtable::commit::commit_pending;
use streamtable::generate::SourceRecord;
use streamtable::spec::PipelineSpec;

use super::table_scenarios::check_table;
use super::{Harness, event};

const DEBEZIUM: &str = r#"
[[tables]]
name = "customers"
topic = "pg.public.customers"
mode = "upsert"
envelope = "debezium"
primary_key = ["customer_id"]
columns = [
  { name = "customer_id", type = "long", required = true, path = "$.id" },
  { name = "email", type = "string" },
  { name = "source_lsn", type = "long", path = "$.__source.lsn" },
  { name = "op", type = "string", path = "$.__op" },
]
"#;

/// A Debezium (PostgreSQL connector, 2.x/3.x) change event as the JSON converter writes it,
/// with its schema when `schemas` (the envelope of the Debezium documentation, abridged).
fn change(op: &str, id: i64, email: Option<&str>, lsn: i64, schemas: bool) -> Vec<u8> {
    let row = |email: Option<&str>| serde_json::json!({ "id": id, "email": email });
    let (before, after) = match op {
        "d" => (row(email), Value::Null),
        "t" => (Value::Null, Value::Null),
        _ => (Value::Null, row(email)),
    };
    let payload = serde_json::json!({
        "before": before,
        "after": after,
        "source": {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg",
                   "ts_ms": 1795946400000i64 + lsn, "snapshot": op == "r", "db": "shop",
                   "schema": "public", "table": "customers", "txId": 500 + lsn, "lsn": lsn},
        "op": op,
        "ts_ms": 1795946400000i64 + lsn,
    });
    let event = if schemas {
        serde_json::json!({"schema": {"type": "struct", "name": "pg.public.customers.Envelope",
                                      "optional": false, "fields": []},
                           "payload": payload})
    } else {
        payload
    };
    event.to_string().into_bytes()
}

/// Lands a batch of changes holding one truncate and commits it: the keys the batch deletes,
/// and the commit round of the customers table. The truncate is the batch's only dead letter,
/// of kind `envelope`, saying why.
async fn land_changes(
    h: &Harness,
    tables: &streamtable::tables::TableSet,
    batch: &[SourceRecord],
) -> (u64, streamtable::commit::UpsertStats) {
    let summary = h.ingestor().handle(&event(batch)).await.expect("changes");
    assert_eq!(summary.dead_lettered, 1, "the truncate: {summary:?}");
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].kind, "envelope");
    assert!(dead[0].message.contains("truncate"), "{}", dead[0].message);
    let round = commit_pending(&h.backend, tables).await.expect("commit");
    assert!(round.audit.ok(), "the round's audit: {:?}", round.audit);
    let stats = round
        .tables
        .iter()
        .find(|t| t.table == "customers")
        .and_then(|t| t.upsert.clone())
        .expect("upsert round");
    (summary.key_deletes, stats)
}

pub async fn debezium_changes_read_back_as_the_current_rows(h: &mut Harness) {
    h.spec = PipelineSpec::parse(
        DEBEZIUM,
        Path::new("debezium.toml"),
        &streamtable::process::Planner,
    )
    .expect("debezium spec");
    let tables = h.tables();
    let key = |id: i64, schemas: bool| {
        let k = serde_json::json!({ "id": id });
        let k = if schemas {
            serde_json::json!({"schema": {"type": "struct", "fields": [{"type": "int64", "field": "id"}]}, "payload": k})
        } else {
            k
        };
        Some(k.to_string().into_bytes())
    };
    let mut offset = 0;
    let mut rec = |value: Option<Vec<u8>>, id: i64, schemas: bool| {
        offset += 1;
        SourceRecord {
            topic: "pg.public.customers".into(),
            partition: 0,
            offset: offset - 1,
            timestamp_ms: 1_795_946_400_000 + offset,
            key: key(id, schemas),
            value,
            raw_value_field: None,
        }
    };
    let first = vec![
        rec(Some(change("r", 1, Some("a@x"), 10, true)), 1, true),
        rec(Some(change("r", 2, Some("b@x"), 11, true)), 2, true),
        rec(Some(change("c", 3, Some("c@x"), 12, false)), 3, false),
        rec(Some(change("c", 4, Some("d@x"), 13, false)), 4, false),
        rec(Some(change("c", 5, Some("e@x"), 14, false)), 5, false),
    ];
    h.ingestor()
        .handle(&event(&first))
        .await
        .expect("snapshot and creates");
    commit_pending(&h.backend, &tables).await.expect("commit");
    let second = vec![
        rec(Some(change("u", 2, Some("b2@x"), 20, false)), 2, false),
        // A delete with its key's columns in before, then the tombstone Debezium sends after it.
        rec(Some(change("d", 3, Some("c@x"), 21, true)), 3, true),
        rec(None, 3, true),
        // A delete without before (the key comes from the Kafka key).
        {
            let mut v: Value =
                serde_json::from_slice(&change("d", 4, None, 22, false)).expect("json");
            v["before"] = Value::Null;
            rec(Some(v.to_string().into_bytes()), 4, false)
        },
        rec(Some(change("t", 0, None, 23, false)), 0, false),
        rec(Some(change("u", 5, Some("e2@x"), 24, true)), 5, true),
        rec(Some(change("c", 6, Some("f@x"), 25, false)), 6, false),
    ];
    let (key_deletes, stats) = land_changes(h, &tables, &second).await;
    assert_eq!(key_deletes, 3, "two deletes and a tombstone");
    assert_eq!(stats.keys_deleted, 2);
    assert_eq!(stats.keys, 4);
    assert_eq!(
        stats.index_entries, 6,
        "the two deleted keys are remembered with their tombstones' positions"
    );
    let rows = super::query_rows(
        h,
        "SELECT customer_id, email, source_lsn, op FROM customers ORDER BY customer_id",
    )
    .await;
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| r.into_iter().map(|c| c.unwrap_or_default()).collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["1", "a@x", "10", "r"],
            ["2", "b2@x", "20", "u"],
            ["5", "e2@x", "24", "u"],
            ["6", "f@x", "25", "c"],
        ]
        .map(|r| r.map(str::to_string).to_vec())
    );
    // pyiceberg and DuckDB apply the deletes too: the rows of offsets 0, 5, 10 and 11.
    check_table(
        h,
        "customers",
        &[[0, 0], [0, 5], [0, 10], [0, 11]].map(|p| serde_json::json!(p)),
    );
}

/// The envelope Debezium's AvroConverter registers for a PostgreSQL table (Debezium 2.7,
/// "Debezium connector for PostgreSQL — Data change events", `source` abridged to the fields
/// read here and a few others): `before` and `after` of the table's `Value` record, `since` a
/// MicroTimestamp (the connector's default `time.precision.mode`).
fn debezium_envelope(topic: &str) -> Value {
    serde_json::json!({
        "type": "record", "name": "Envelope", "namespace": topic,
        "connect.name": format!("{topic}.Envelope"),
        "fields": [
            {"name": "before", "default": null, "type": ["null", {
                "type": "record", "name": "Value", "connect.name": format!("{topic}.Value"),
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "email", "type": ["null", "string"], "default": null},
                    {"name": "since", "default": null, "type": ["null", {"type": "long",
                        "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}]},
                ]}]},
            {"name": "after", "type": ["null", "Value"], "default": null},
            {"name": "source", "type": {
                "type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                "connect.name": "io.debezium.connector.postgresql.Source",
                "fields": [
                    {"name": "version", "type": "string"},
                    {"name": "connector", "type": "string"},
                    {"name": "name", "type": "string"},
                    {"name": "ts_ms", "type": "long"},
                    {"name": "snapshot", "default": "false", "type": [{"type": "string",
                        "connect.version": 1, "connect.name": "io.debezium.data.Enum",
                        "connect.parameters": {"allowed": "true,last,false,incremental"}}, "null"]},
                    {"name": "db", "type": "string"},
                    {"name": "schema", "type": "string"},
                    {"name": "table", "type": "string"},
                    {"name": "txId", "type": ["null", "long"], "default": null},
                    {"name": "lsn", "type": ["null", "long"], "default": null},
                ]}},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": null},
            {"name": "transaction", "default": null, "type": ["null", {
                "type": "record", "name": "block", "namespace": "event",
                "fields": [
                    {"name": "id", "type": "string"},
                    {"name": "total_order", "type": "long"},
                    {"name": "data_collection_order", "type": "long"},
                ]}]},
        ]
    })
}

/// One change event for fastavro: `before`/`after` as (id, email, since in µs).
fn avro_change(
    op: &str,
    before: Option<(i64, &str)>,
    after: Option<(i64, &str)>,
    lsn: i64,
) -> Value {
    let row = |r: Option<(i64, &str)>| match r {
        None => Value::Null,
        Some((id, email)) => serde_json::json!({
            "id": id, "email": email, "since": 1_795_946_400_000_000i64 + id * 1_000_001,
        }),
    };
    serde_json::json!({
        "before": row(before),
        "after": row(after),
        "source": {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg",
                   "ts_ms": 1_795_946_400_000i64 + lsn, "snapshot": if op == "r" { "true" } else { "false" },
                   "db": "shop", "schema": "public", "table": "customers",
                   "txId": 500 + lsn, "lsn": lsn},
        "op": op,
        "ts_ms": 1_795_946_400_000i64 + lsn,
        "transaction": null,
    })
}

/// Debezium change events in Avro, written by fastavro with the envelope Debezium's
/// AvroConverter registers, framed as Confluent's serializer frames them, keys too: creates,
/// snapshot reads, updates, deletes with `before` and without (the framed Kafka key names the
/// row), the tombstones after them, a truncate. The table reads back as the source's rows.
pub async fn debezium_avro_changes_read_back_as_the_current_rows(h: &mut Harness) {
    use super::format_scenarios::{Framing, produce, registry_url};
    let url = registry_url();
    let topic = format!("pg.public.customers_{}", uuid::Uuid::new_v4().simple());
    h.spec = PipelineSpec::parse(
        &format!(
            "[registry]\nurl = \"{url}\"\n{}",
            DEBEZIUM
                .replace(
                    "topic = \"pg.public.customers\"",
                    &format!("topic = \"{topic}\"")
                )
                .replace(
                    "envelope = \"debezium\"",
                    "envelope = \"debezium\"\nformat = \"avro\""
                )
                .replace(
                    "columns = [",
                    "columns = [\n  { name = \"since\", type = \"timestamp\" },"
                )
        ),
        Path::new("debezium.toml"),
        &streamtable::process::Planner,
    )
    .expect("debezium avro spec");
    let tables = h.tables();
    let (value_subject, key_subject) = (format!("{topic}-value"), format!("{topic}-key"));
    let values = |events: &[Value]| {
        produce(
            &debezium_envelope(&topic),
            events,
            &Framing::Confluent {
                url: &url,
                subject: &value_subject,
            },
        )
    };
    let key_schema = serde_json::json!({
        "type": "record", "name": "Key", "namespace": topic,
        "connect.name": format!("{topic}.Key"),
        "fields": [{"name": "id", "type": "long"}],
    });
    let keys = |ids: &[i64]| {
        let records: Vec<Value> = ids
            .iter()
            .map(|id| serde_json::json!({ "id": id }))
            .collect();
        produce(
            &key_schema,
            &records,
            &Framing::Confluent {
                url: &url,
                subject: &key_subject,
            },
        )
    };
    let mut offset = 0;
    let mut records = |changes: Vec<(Option<Vec<u8>>, Vec<u8>)>| -> Vec<SourceRecord> {
        changes
            .into_iter()
            .map(|(value, key)| {
                offset += 1;
                SourceRecord {
                    topic: topic.clone(),
                    partition: 0,
                    offset: offset - 1,
                    timestamp_ms: 1_795_946_400_000 + offset,
                    key: Some(key),
                    value,
                    raw_value_field: None,
                }
            })
            .collect()
    };
    let first = values(&[
        avro_change("r", None, Some((1, "a@x")), 10),
        avro_change("r", None, Some((2, "b@x")), 11),
        avro_change("c", None, Some((3, "c@x")), 12),
        avro_change("c", None, Some((4, "d@x")), 13),
        avro_change("c", None, Some((5, "e@x")), 14),
    ]);
    let first = records(
        first
            .into_iter()
            .zip(keys(&[1, 2, 3, 4, 5]))
            .map(|(v, k)| (Some(v), k))
            .collect(),
    );
    h.ingestor()
        .handle(&event(&first))
        .await
        .expect("snapshot and creates");
    commit_pending(&h.backend, &tables).await.expect("commit");
    let changes = values(&[
        avro_change("u", None, Some((2, "b2@x")), 20),
        avro_change("d", Some((3, "c@x")), None, 21),
        avro_change("d", None, None, 22),
        avro_change("t", None, None, 23),
        avro_change("u", Some((5, "e@x")), Some((5, "e2@x")), 24),
        avro_change("c", None, Some((6, "f@x")), 25),
    ]);
    let k = keys(&[2, 3, 4, 1, 5, 6]);
    let second = records(vec![
        (Some(changes[0].clone()), k[0].clone()),
        // A delete with its key in before, then the tombstone Debezium sends after it.
        (Some(changes[1].clone()), k[1].clone()),
        (None, k[1].clone()),
        // A delete without before: the framed Kafka key names the row.
        (Some(changes[2].clone()), k[2].clone()),
        (Some(changes[3].clone()), k[2].clone()),
        // A tombstone alone (log compaction's) deletes key 1.
        (None, k[3].clone()),
        (Some(changes[4].clone()), k[4].clone()),
        (Some(changes[5].clone()), k[5].clone()),
    ]);
    let (key_deletes, stats) = land_changes(h, &tables, &second).await;
    assert_eq!(key_deletes, 4, "two deletes and two tombstones");
    assert_eq!(stats.keys_deleted, 3, "keys 1, 3 and 4");
    assert_eq!(stats.keys, 3);
    let rows = super::query_rows(
        h,
        "SELECT customer_id, email, CAST(since AS BIGINT) AS since, source_lsn, op FROM customers ORDER BY customer_id",
    )
    .await;
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| r.into_iter().map(|c| c.unwrap_or_default()).collect())
        .collect();
    let since = |id: i64| (1_795_946_400_000_000i64 + id * 1_000_001).to_string();
    assert_eq!(
        rows,
        [
            ["2", "b2@x", &since(2), "20", "u"],
            ["5", "e2@x", &since(5), "24", "u"],
            ["6", "f@x", &since(6), "25", "c"],
        ]
        .map(|r| r.map(str::to_string).to_vec()),
        "MicroTimestamps read as microseconds"
    );
    // pyiceberg and DuckDB apply the deletes too: the rows of offsets 5, 11 and 12.
    check_table(
        h,
        "customers",
        &[[0, 5], [0, 11], [0, 12]].map(|p| serde_json::json!(p)),
    );
}
