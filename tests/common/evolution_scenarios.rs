//! Schema evolution: a spec change evolves the table at the next start (ingest) or commit, old
//! files keep their values under the new schema, and a change the table cannot make stops only
//! that table — read back through pyiceberg and DuckDB after each step, time travel included.

use std::path::Path;

use serde_json::{Value, json};
use streamtable::generate::SourceRecord;
use streamtable::ingest::Ingestor;
use streamtable::scheduled;
use streamtable::spec::PipelineSpec;
use streamtable::tables::TableSet;

use super::table_scenarios::sched;
use super::{Harness, event};

const PAYMENTS: &str = r#"
[[tables]]
name = "payments"
topic = "payments"
columns = [
  { name = "payment_id", type = "string", required = true },
  { name = "amount", type = "double" },
]
"#;

/// The first spec of `orders`.
const V1: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
partition_by = ["day(created_at)"]
columns = [
  { name = "order_id",    type = "string",        required = true },
  { name = "qty",         type = "int" },
  { name = "amount",      type = "decimal(12,2)", required = true },
  { name = "status",      type = "string" },
  { name = "customer_id", type = "string" },
  { name = "created_at",  type = "timestamp",     required = true },
]
"#;

/// Every change Iceberg allows: int → long, decimal precision up, a rename by field id (the
/// JSON field keeps its name), a dropped column, a new optional column, required → optional.
const V2: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
partition_by = ["day(created_at)"]
columns = [
  { name = "order_id",    type = "string",        required = true },
  { name = "qty",         type = "long" },
  { name = "amount",      type = "decimal(18,2)" },
  { name = "state",       type = "string", renamed_from = "status", path = "$.status" },
  { name = "coupon",      type = "string" },
  { name = "created_at",  type = "timestamp",     required = true },
]
"#;

/// A narrowing the table cannot make.
const V3: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
partition_by = ["day(created_at)"]
columns = [
  { name = "order_id",    type = "string",        required = true },
  { name = "qty",         type = "int" },
  { name = "amount",      type = "decimal(18,2)" },
  { name = "state",       type = "string", path = "$.status" },
  { name = "coupon",      type = "string" },
  { name = "created_at",  type = "timestamp",     required = true },
]
"#;

fn spec(orders: &str) -> PipelineSpec {
    PipelineSpec::parse(
        &format!("{orders}{PAYMENTS}"),
        Path::new("evolution.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec")
}

const T0: i64 = 1_795_946_400_000;

fn record(topic: &str, offset: i64, value: Value) -> SourceRecord {
    SourceRecord {
        topic: topic.into(),
        partition: 0,
        offset,
        timestamp_ms: T0 + offset,
        key: Some(format!("k{offset}").into_bytes()),
        value: Some(value.to_string().into_bytes()),
        raw_value_field: None,
    }
}

fn order(offset: i64, qty: i64, amount: &str, coupon: Option<&str>) -> SourceRecord {
    let mut v = json!({
        "order_id": format!("o{offset}"), "qty": qty, "amount": amount, "status": format!("s{offset}"),
        "customer_id": format!("c{offset}"), "created_at": "2026-11-30T10:00:00Z",
    });
    if let Some(c) = coupon {
        v["coupon"] = json!(c);
    }
    record("orders", offset, v)
}

fn payment(offset: i64) -> SourceRecord {
    record(
        "payments",
        offset,
        json!({"payment_id": format!("p{offset}"), "amount": 1.5}),
    )
}

async fn land(
    h: &Harness,
    spec: &PipelineSpec,
    records: &[SourceRecord],
) -> scheduled::ScheduledReport {
    let ingestor = Ingestor::connect(spec, &h.backend).await.expect("ingestor");
    let _ = ingestor.handle(&event(records)).await;
    let tables = TableSet::new(spec, &h.backend.namespace).expect("tables");
    scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("scheduled run")
}

/// The business columns of pyiceberg's rows (the Kafka columns dropped), sorted.
fn business(h: &Harness, table: &str, snapshot: Option<i64>, columns: usize) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = h
        .pyiceberg_rows(table, snapshot)
        .into_iter()
        .map(|r| r[..columns].to_vec())
        .collect();
    rows.sort();
    rows
}

pub async fn a_changed_spec_evolves_the_table_and_old_rows_keep_their_values(h: &Harness) {
    let v1 = spec(V1);
    land(
        h,
        &v1,
        &[order(0, 2, "10.50", None), order(1, 3, "7.25", None)],
    )
    .await;
    let before = h.read_external("pyiceberg", "orders");
    let s1 = before["current_snapshot_id"].as_i64().expect("snapshot");
    assert_eq!(before["count"], 2);

    // `streamtable check` shows the plan first, the same on every backend.
    let v2 = spec(V2);
    let tables = TableSet::new(&v2, &h.backend.namespace).expect("tables");
    let (plan, refused) = streamtable::cli::check::catalog_plan(&h.backend, &tables)
        .await
        .expect("plan");
    assert_eq!(refused, 0);
    assert!(
        plan.contains(
            "  table orders:\n    ~ qty int → long\n    ~ amount decimal(12,2) → decimal(18,2)\n    \
             ~ amount: required → optional\n    ~ status renamed to state (same field id)\n    \
             + column coupon string (optional)\n    \
             - column customer_id (dropped from the schema; older files keep its values)\n"
        ) && plan.contains("  table payments: no change\n"),
        "{plan}"
    );
    // v2 evolves the table when ingest starts; the new rows carry the new column.
    let report = land(
        h,
        &v2,
        &[order(2, 5_000_000_000, "1234567890123.45", Some("XMAS"))],
    )
    .await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let after = h.read_external("pyiceberg", "orders");
    let columns: Vec<&str> = after["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        &columns[..6],
        ["order_id", "qty", "amount", "state", "coupon", "created_at"]
    );
    assert!(!columns.contains(&"customer_id") && !columns.contains(&"status"));
    let ts = "1796032800000000";
    let rows_after = business(h, "orders", None, 6);
    assert_eq!(
        rows_after,
        [
            vec!["o0", "2", "10.50", "s0", "NULL", ts],
            vec!["o1", "3", "7.25", "s1", "NULL", ts],
            vec!["o2", "5000000000", "1234567890123.45", "s2", "XMAS", ts],
        ]
    );
    assert_eq!(h.read_external("duckdb", "orders")["count"], 3);
    // Time travel to before the change still reads the two first rows.
    assert_eq!(
        h.read_external_at("pyiceberg", "orders", Some(s1))["count"],
        2
    );
    // Trino (on the AWS backend) reads the widened, renamed, added and dropped columns as
    // pyiceberg does, now and before the change.
    h.assert_trino_reads_as_pyiceberg("orders", None);
    h.assert_trino_reads_as_pyiceberg("orders", Some(s1));

    // A narrowing is shown as refused before anything is deployed.
    let (plan, refused) = streamtable::cli::check::catalog_plan(
        &h.backend,
        &TableSet::new(&spec(V3), &h.backend.namespace).expect("tables"),
    )
    .await
    .expect("plan");
    assert_eq!(refused, 1, "{plan}");
    assert!(
        plan.contains("    ! qty: long → int — refused: Iceberg only widens"),
        "{plan}"
    );

    // Compaction rewrites files of both schemas into the evolved one, values unchanged.
    let tables = TableSet::new(&v2, &h.backend.namespace).expect("tables");
    let opts = streamtable::compact::CompactOptions {
        min_input_files: 2,
        ..super::table_scenarios::opts()
    };
    let compacted = streamtable::compact::compact_all(&h.backend, &tables, &opts)
        .await
        .expect("compact");
    assert!(
        compacted.iter().any(|c| c.table == "orders"),
        "{compacted:?}"
    );
    assert_eq!(business(h, "orders", None, 6), rows_after);
    h.assert_trino_reads_as_pyiceberg("orders", None);
    let after = h.read_external("pyiceberg", "orders");
    assert_eq!(h.read_external("duckdb", "orders")["count"], 3);

    // Starting again with the same spec changes nothing.
    let metadata = after["metadata_location"].clone();
    let again = Ingestor::connect(&v2, &h.backend).await.expect("ingestor");
    drop(again);
    assert_eq!(
        h.read_external("pyiceberg", "orders")["metadata_location"],
        metadata
    );
}

pub async fn a_refused_change_stops_only_its_table(h: &Harness) {
    let v2 = spec(V2);
    land(h, &v2, &[order(0, 2, "10.50", Some("A")), payment(0)]).await;

    // v3 narrows qty: orders is refused, payments keeps landing and committing.
    let v3 = spec(V3);
    let ingestor = Ingestor::connect(&v3, &h.backend).await.expect("ingestor");
    let err = ingestor
        .handle(&event(&[order(1, 1, "1.00", None), payment(1)]))
        .await
        .expect_err("orders is refused");
    let text = err.to_string();
    assert!(
        text.contains("table orders: schema change refused: ! qty: long → int")
            && text.contains("streamtable check"),
        "{text}"
    );
    assert!(!err.is_retryable());
    let tables = TableSet::new(&v3, &h.backend.namespace).expect("tables");
    let report = scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("run");
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.table.as_deref() == Some("orders")
                && f.error.contains("schema change refused")),
        "{:?}",
        report.failures
    );
    assert_eq!(h.read_external("pyiceberg", "payments")["count"], 2);
    assert_eq!(h.read_external("pyiceberg", "orders")["count"], 1);
    // `streamtable tables` shows it with the last run's failures.
    let status = scheduled::last_run(&h.backend)
        .await
        .expect("status")
        .expect("a run finished");
    let shown = streamtable::cli::table_list::render_last_run(&status, status.finished_at_ms);
    assert!(
        shown.contains("orders") && shown.contains("! qty: long → int — refused"),
        "{shown}"
    );
    // The refused record was not checkpointed: once the spec is fixed it lands.
    let fixed = Ingestor::connect(&v2, &h.backend).await.expect("ingestor");
    fixed
        .handle(&event(&[order(1, 1, "1.00", None)]))
        .await
        .expect("orders lands again");
    let tables = TableSet::new(&v2, &h.backend.namespace).expect("tables");
    scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("run");
    assert_eq!(h.read_external("pyiceberg", "orders")["count"], 2);
}
