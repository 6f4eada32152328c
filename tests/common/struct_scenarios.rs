//! Struct columns: a JSON object lands as an Iceberg struct; a field added inside the struct and a
//! field widened inside it evolve the table, and rows written before read the new field as NULL —
//! read back through pyiceberg and DuckDB after each step, time travel included.

use std::path::Path;

use serde_json::{Value, json};
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::generate::SourceRecord;
use streamtable::ingest::Ingestor;
use streamtable::scheduled;
use streamtable::spec::PipelineSpec;
use streamtable::tables::TableSet;

use super::table_scenarios::sched;
use super::{Harness, event};

/// The first spec: a struct of two fields.
const V1: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
partition_by = ["day(created_at)"]
columns = [
  { name = "order_id",   type = "string",    required = true },
  { name = "customer",   type = "struct",    fields = [
      { name = "id",   type = "string" },
      { name = "tier", type = "int", path = "$.level" },
  ] },
  { name = "created_at", type = "timestamp", required = true },
]
"#;

/// A field widened and a field added inside the struct.
const V2: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
partition_by = ["day(created_at)"]
columns = [
  { name = "order_id",   type = "string",    required = true },
  { name = "customer",   type = "struct",    fields = [
      { name = "id",     type = "string" },
      { name = "tier",   type = "long", path = "$.level" },
      { name = "region", type = "string" },
  ] },
  { name = "created_at", type = "timestamp", required = true },
]
"#;

const T0: i64 = 1_795_946_400_000;

fn spec(text: &str) -> PipelineSpec {
    PipelineSpec::parse(
        text,
        Path::new("structs.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec")
}

fn order(offset: i64, customer: Value) -> SourceRecord {
    let mut v = json!({"order_id": format!("o{offset}"), "created_at": "2026-11-30T10:00:00Z"});
    if !customer.is_null() {
        v["customer"] = customer;
    }
    SourceRecord {
        topic: "orders".into(),
        partition: 0,
        offset,
        timestamp_ms: T0 + offset,
        key: None,
        value: Some(v.to_string().into_bytes()),
        raw_value_field: None,
    }
}

async fn land(h: &Harness, spec: &PipelineSpec, records: &[SourceRecord]) {
    let ingestor = Ingestor::connect(spec, &h.backend).await.expect("ingestor");
    let summary = ingestor.handle(&event(records)).await.expect("ingest");
    assert_eq!(summary.dead_lettered, 0);
    let tables = TableSet::new(spec, &h.backend.namespace).expect("tables");
    let report = scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("scheduled run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

fn rows(h: &Harness, snapshot: Option<i64>) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = h
        .pyiceberg_rows("orders", snapshot)
        .into_iter()
        .map(|r| r[..3].to_vec())
        .collect();
    rows.sort();
    rows
}

fn row(cells: [&str; 3]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

pub async fn a_struct_lands_and_evolves_inside(h: &Harness) {
    let ts = "1796032800000000";
    // Written before the table exists: the files carry the ids the table's creation assigns.
    land(
        h,
        &spec(V1),
        &[
            order(0, json!({"id": "c0", "level": 1})),
            order(1, Value::Null),
            order(2, json!({"id": "c2"})),
        ],
    )
    .await;
    let before = vec![
        row(["o0", "{'id': 'c0', 'tier': 1}", ts]),
        row(["o1", "NULL", ts]),
        row(["o2", "{'id': 'c2', 'tier': None}", ts]),
    ];
    assert_eq!(rows(h, None), before);
    assert_eq!(h.read_external("duckdb", "orders")["count"], 3);
    let s1 = h.read_external("pyiceberg", "orders")["current_snapshot_id"]
        .as_i64()
        .expect("snapshot");

    let v2 = spec(V2);
    let tables = TableSet::new(&v2, &h.backend.namespace).expect("tables");
    let (plan, refused) = streamtable::cli::check::catalog_plan(&h.backend, &tables)
        .await
        .expect("plan");
    assert_eq!(refused, 0);
    assert!(
        plan.contains(
            "  table orders:\n    ~ customer.tier int → long\n    + column customer.region string (optional)\n"
        ),
        "{plan}"
    );
    land(
        h,
        &v2,
        &[order(
            3,
            json!({"id": "c3", "level": 5_000_000_000_i64, "region": "eu"}),
        )],
    )
    .await;
    assert_eq!(
        rows(h, None),
        [
            row(["o0", "{'id': 'c0', 'tier': 1, 'region': None}", ts]),
            row(["o1", "NULL", ts]),
            row(["o2", "{'id': 'c2', 'tier': None, 'region': None}", ts]),
            row(["o3", "{'id': 'c3', 'tier': 5000000000, 'region': 'eu'}", ts]),
        ]
    );
    assert_eq!(h.read_external("duckdb", "orders")["count"], 4);
    assert_eq!(rows(h, Some(s1)), before);
    // Trino (on the AWS backend) reads the struct, its widened and added fields, as pyiceberg.
    h.assert_trino_reads_as_pyiceberg("orders", None);
    h.assert_trino_reads_as_pyiceberg("orders", Some(s1));

    // Compaction rewrites the files of both schemas into one, each struct read by field id.
    let after = rows(h, None);
    let options = CompactOptions {
        min_input_files: 2,
        ..CompactOptions::default()
    };
    let report = compact_all(&h.backend, &tables, &options)
        .await
        .expect("compact");
    assert!(
        report
            .iter()
            .any(|c| c.table == "orders" && c.input_files == 2 && c.output_files == 1),
        "{report:?}"
    );
    assert_eq!(rows(h, None), after);
    h.assert_trino_reads_as_pyiceberg("orders", None);

    // A struct field's value of the wrong type is a dead letter naming the path.
    let ingestor = Ingestor::connect(&v2, &h.backend).await.expect("ingestor");
    let summary = ingestor
        .handle(&event(&[order(4, json!({"id": 7}))]))
        .await
        .expect("ingest");
    assert_eq!(summary.dead_lettered, 1);
}
