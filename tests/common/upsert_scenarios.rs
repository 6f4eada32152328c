//! Upsert tables (`mode = "upsert"`): after every commit the table holds the last record of
//! each key — computed here from all input, by a model that knows nothing of the index or the
//! delete files — as pyiceberg and DuckDB read it (position deletes applied), through
//! re-deliveries, a commit re-run and compactions that apply the deletes.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use streamtable::commit::commit_pending;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::generate::SourceRecord;
use streamtable::spec::PipelineSpec;

use super::table_scenarios::check_table;
use super::{Harness, event};

const SPEC: &str = r#"
[[tables]]
name = "order_status"
topic = "order-status"
mode = "upsert"
primary_key = ["order_id"]
partition_by = ["day(updated_at)"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "status", type = "string" },
  { name = "amount", type = "decimal(12,2)" },
  { name = "updated_at", type = "timestamp", required = true },
]
"#;

const STATUSES: [&str; 4] = ["placed", "paid", "shipped", "cancelled"];

fn upsert_spec() -> PipelineSpec {
    PipelineSpec::parse(
        SPEC,
        Path::new("upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("upsert spec")
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The input so far and what the table must hold: per key, the last record's position.
#[derive(Default)]
struct Model {
    offsets: [i64; 2],
    last: BTreeMap<String, (i32, i64)>,
}

impl Model {
    /// `n` records of random keys among `keys`; a key always goes to the same partition (as a
    /// producer keying by the primary key sends it), its event time moving over three days.
    fn batch(&mut self, rng: &mut Rng, n: usize, keys: u64, round: i64) -> Vec<SourceRecord> {
        let base = 1_795_946_400_000i64; // 2026-11-29T08:00:00Z
        (0..n)
            .map(|_| {
                let k = rng.next(keys);
                let key = format!("o{k}");
                let partition = (k % 2) as i32;
                let offset = self.offsets[partition as usize];
                self.offsets[partition as usize] += 1;
                let at = base + round * 16 * 3600 * 1000 + offset * 1000;
                // One record in eight deletes its order: a tombstone, its key as text or as
                // a JSON object of the key's columns.
                if rng.next(8) == 0 {
                    self.last.remove(&key);
                    let key = if offset % 2 == 0 {
                        key.into_bytes()
                    } else {
                        serde_json::json!({ "order_id": key })
                            .to_string()
                            .into_bytes()
                    };
                    return SourceRecord {
                        topic: "order-status".into(),
                        partition,
                        offset,
                        timestamp_ms: at,
                        key: Some(key),
                        value: None,
                        raw_value_field: None,
                    };
                }
                let status = STATUSES[rng.next(4) as usize];
                let value = serde_json::json!({
                    "order_id": key,
                    "status": status,
                    "amount": format!("{}.{:02}", rng.next(500), rng.next(100)),
                    "updated_at": chrono::DateTime::from_timestamp_millis(at)
                        .expect("time")
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                });
                self.last.insert(key.clone(), (partition, offset));
                SourceRecord {
                    topic: "order-status".into(),
                    partition,
                    offset,
                    timestamp_ms: at,
                    key: Some(key.into_bytes()),
                    value: Some(value.to_string().into_bytes()),
                    raw_value_field: None,
                }
            })
            .collect()
    }

    fn expected(&self) -> Vec<Value> {
        let mut keys: Vec<(i32, i64)> = self.last.values().copied().collect();
        keys.sort();
        keys.into_iter()
            .map(|(p, o)| serde_json::json!([p, o]))
            .collect()
    }
}

/// A field of the current snapshot's summary, as pyiceberg reads it.
fn summary(v: &Value, key: &str) -> i64 {
    let last = v["snapshots"]
        .as_array()
        .and_then(|s| s.last())
        .expect("snapshots");
    last["summary"][key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1)
}

pub async fn upserts_read_back_as_the_last_record_per_key(h: &mut Harness) {
    h.spec = upsert_spec();
    let tables = h.tables();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut model = Model::default();
    let compact = CompactOptions {
        min_input_files: 2,
        ..CompactOptions::default()
    };
    let mut previous: Option<Vec<SourceRecord>> = None;
    let (mut bases, mut runs_of_changes, mut cold, mut keys_deleted) = (0, 0, 0, 0);
    for round in 0..10i64 {
        // Every other round starts as a cold process does: the key index read from its runs.
        if round % 2 == 1 {
            super::forget_warm_index(h, "order_status").await;
        }
        let batch = model.batch(&mut rng, 30, 40, round);
        h.ingestor().handle(&event(&batch)).await.expect("ingest");
        // The ESM delivers the batch before again (and this one twice): nothing lands twice.
        if let Some(before) = &previous {
            let mut again = before.clone();
            again.extend(batch.iter().cloned());
            h.ingestor()
                .handle(&event(&again))
                .await
                .expect("re-delivery");
        }
        previous = Some(batch);
        let report = commit_pending(&h.backend, &tables).await.expect("commit");
        let upsert = report
            .tables
            .iter()
            .find(|t| t.table == "order_status")
            .and_then(|t| t.upsert.clone())
            .expect("the upsert table's round");
        assert_eq!(
            upsert.keys as usize,
            model.last.len(),
            "keys after round {round}"
        );
        if round > 0 {
            assert!(upsert.rows_deleted > 0, "round {round} replaced rows");
        }
        assert_eq!(
            upsert.index_warm,
            round % 2 == 0 && round > 0,
            "round {round}"
        );
        if upsert.index_base {
            bases += 1;
        } else {
            runs_of_changes += 1;
        }
        cold += usize::from(!upsert.index_warm);
        keys_deleted += upsert.keys_deleted;
        // A commit run again finds nothing more to do, and changes nothing.
        let again = commit_pending(&h.backend, &tables)
            .await
            .expect("commit again");
        assert_eq!(again.batches, 0);
        if round == 3 {
            let done = compact_all(&h.backend, &tables, &compact)
                .await
                .expect("compact");
            assert!(
                !done.is_empty(),
                "compaction rewrote the partitions with deleted rows"
            );
            let v = check_table(h, "order_status", &model.expected());
            assert_eq!(
                summary(&v, "total-delete-files"),
                0,
                "compaction applied every delete file and dropped it"
            );
            assert_eq!(
                summary(&v, "total-records"),
                model.last.len() as i64,
                "after compaction the files hold only the live rows"
            );
        }
        check_table(h, "order_status", &model.expected());
    }
    assert!(
        bases >= 2 && runs_of_changes >= 2,
        "the key index was written as bases ({bases}) and as runs of changes ({runs_of_changes})"
    );
    assert!(cold >= 5, "rounds read their index from its runs: {cold}");
    assert!(keys_deleted > 0, "tombstones deleted keys");
    // Trino (Athena's engine) applies the position deletes as pyiceberg does (on moto).
    h.assert_trino_reads_as_pyiceberg("order_status", None);
    // The engine of `streamtable query` applies the deletes too.
    let n = super::count(h, "SELECT count(*) FROM order_status").await;
    assert_eq!(n as usize, model.last.len());
    let distinct = super::count(h, "SELECT count(DISTINCT order_id) FROM order_status").await;
    assert_eq!(distinct, n, "one row per key");
}

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
    let summary = h.ingestor().handle(&event(&second)).await.expect("changes");
    assert_eq!(summary.key_deletes, 3, "two deletes and a tombstone");
    assert_eq!(summary.dead_lettered, 1, "the truncate");
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].kind, "envelope");
    assert!(dead[0].message.contains("truncate"), "{}", dead[0].message);
    let round = commit_pending(&h.backend, &tables).await.expect("commit");
    let stats = round
        .tables
        .iter()
        .find(|t| t.table == "customers")
        .and_then(|t| t.upsert.clone())
        .expect("upsert round");
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
    let summary = h.ingestor().handle(&event(&second)).await.expect("changes");
    assert_eq!(summary.dead_lettered, 1, "the truncate: {summary:?}");
    assert_eq!(summary.key_deletes, 4, "two deletes and two tombstones");
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].kind, "envelope");
    assert!(dead[0].message.contains("truncate"), "{}", dead[0].message);
    let round = commit_pending(&h.backend, &tables).await.expect("commit");
    let stats = round
        .tables
        .iter()
        .find(|t| t.table == "customers")
        .and_then(|t| t.upsert.clone())
        .expect("upsert round");
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
