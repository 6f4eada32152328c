//! A table whose columns come from the registry (`columns = "from-registry"`): its columns are
//! the latest version's fields; a new version with a new optional field becomes a column while
//! ingest runs warm; a version without a field keeps its column. Records written by fastavro,
//! schemas in the registry stand-in (Confluent) or moto's Glue Schema Registry; read back
//! through pyiceberg and DuckDB after each step, with time travel to before the change.

use std::path::Path;
use std::sync::Arc;

use streamtable::ingest::{IngestOptions, LiveIngestor, SpecLoader};
use streamtable::registry::resolve::{load_spec, load_spec_detailed};
use streamtable::scheduled;
use streamtable::tables::TableSet;

use super::format_scenarios::{
    Framing, order, produce, records, registry_url, row, schema_v1, schema_v2, ts,
};
use super::table_scenarios::sched;
use super::{Harness, event};

fn spec_text(url: &str, topic: &str, subject: &str) -> String {
    format!(
        r#"
[registry]
url = "{url}"

[[tables]]
name = "orders"
topic = "{topic}"
format = "avro"
columns = "from-registry"
subject = "{subject}"
partition_by = ["day(created_at)"]
"#
    )
}

/// The table's columns as pyiceberg reads them, without the Kafka ones.
fn columns(h: &Harness) -> Vec<String> {
    let all: Vec<String> =
        serde_json::from_value(h.read_external("pyiceberg", "orders")["columns"].clone())
            .expect("columns");
    all.into_iter()
        .filter(|c| !c.starts_with("kafka_"))
        .collect()
}

/// Rows of the table (their first `n` columns), sorted.
fn rows(h: &Harness, snapshot: Option<i64>, n: usize) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = h
        .pyiceberg_rows("orders", snapshot)
        .into_iter()
        .map(|r| r[..n].to_vec())
        .collect();
    rows.sort();
    rows
}

/// The scenario; `glue` names a Glue registry (moto) to take the schemas from instead of the
/// Confluent stand-in.
pub async fn columns_follow_the_registry(h: &Harness, glue: Option<&str>) {
    let url = registry_url();
    let topic = format!("orders-{}", uuid::Uuid::new_v4().simple());
    let (subject, target) = match glue {
        Some(registry) => (
            format!("{registry}/{topic}"),
            Some(format!("{registry}:{topic}")),
        ),
        None => (format!("{topic}-value"), None),
    };
    let framing = match &target {
        Some(target) => Framing::Glue {
            target,
            zlib: false,
        },
        None => Framing::Confluent {
            url: &url,
            subject: &subject,
        },
    };
    let text = spec_text(&url, &topic, &subject);
    let origin = Path::new("registry-columns.toml");

    // Before the subject exists, the spec cannot be read: the message names table and subject.
    let e = load_spec(&text, origin, &h.backend)
        .await
        .expect_err("no subject yet");
    let shown = e.to_string();
    assert!(
        shown.contains("\"orders\"") && shown.contains(&subject) && !e.is_retryable(),
        "{shown}"
    );

    // v1: the columns are its fields (the nested customer flattened, the array left out).
    let v1 = produce(
        &schema_v1(),
        &[
            order(1, Some("c1"), "19.99", None),
            order(2, None, "-5.00", None),
        ],
        &framing,
    );
    let loader: SpecLoader = {
        let (text, backend) = (text.clone(), h.backend.clone());
        Arc::new(move || {
            let (text, backend) = (text.clone(), backend.clone());
            Box::pin(
                async move { load_spec(&text, Path::new("registry-columns.toml"), &backend).await },
            )
        })
    };
    let ingestor = LiveIngestor::new(loader, h.backend.clone(), |s| {
        Ok(IngestOptions::for_spec(s))
    });
    let summary = ingestor
        .handle(&event(&records(&topic, 0, v1)))
        .await
        .expect("v1 lands");
    assert_eq!((summary.accepted, summary.dead_lettered), (2, 0));
    // A scheduled stage that read the spec now, and keeps it (a warm function).
    let stale = TableSet::new(
        &load_spec(&text, origin, &h.backend).await.expect("spec"),
        &h.backend.namespace,
    )
    .expect("tables");
    let report = scheduled::run(&h.backend, &stale, &sched())
        .await
        .expect("run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let v1_columns = [
        "order_id",
        "customer_id",
        "customer_tier",
        "amount",
        "qty",
        "status",
        "created_at",
    ];
    assert_eq!(columns(h), v1_columns);
    let before = vec![
        row(&["o1", "c1", "gold", "19.99", "1", "PAID", &ts(1)]),
        row(&["o2", "NULL", "NULL", "-5.00", "2", "PAID", &ts(2)]),
    ];
    assert_eq!(rows(h, None, 7), before);
    let s1 = h.read_external("pyiceberg", "orders")["current_snapshot_id"]
        .as_i64()
        .expect("snapshot");

    // v2 adds an optional coupon: the warm ingestor meets it, reads the spec again, and the
    // table gains the column before the records land; a v1 record reads it as NULL.
    let mut v2 = produce(
        &schema_v2(),
        &[order(10, Some("c10"), "1.50", Some("XMAS"))],
        &framing,
    );
    v2.extend(produce(
        &schema_v1(),
        &[order(11, Some("c11"), "2.50", None)],
        &framing,
    ));
    let summary = ingestor
        .handle(&event(&records(&topic, 2, v2)))
        .await
        .expect("v2 lands");
    assert_eq!((summary.accepted, summary.dead_lettered), (2, 0));
    // The warm scheduled stage still has v1's columns: it commits without dropping coupon.
    let report = scheduled::run(&h.backend, &stale, &sched())
        .await
        .expect("run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let mut with_coupon: Vec<&str> = v1_columns.to_vec();
    with_coupon.push("coupon");
    assert_eq!(columns(h), with_coupon);
    let mut after: Vec<Vec<String>> = before
        .iter()
        .map(|r| [r.clone(), vec!["NULL".to_string()]].concat())
        .collect();
    after.push(row(&[
        "o10",
        "c10",
        "gold",
        "1.50",
        "10",
        "PAID",
        &ts(10),
        "XMAS",
    ]));
    after.push(row(&[
        "o11",
        "c11",
        "gold",
        "2.50",
        "11",
        "PAID",
        &ts(11),
        "NULL",
    ]));
    after.sort();
    assert_eq!(rows(h, None, 8), after);
    assert_eq!(h.read_external("duckdb", "orders")["count"], 4);
    assert_eq!(
        h.read_external_at("pyiceberg", "orders", Some(s1))["count"],
        2
    );

    // v3 drops qty: the table keeps it (old rows keep their values, new ones read NULL).
    let mut v3 = schema_v2();
    v3["fields"]
        .as_array_mut()
        .expect("fields")
        .retain(|f| f["name"] != "qty");
    let mut third = order(20, Some("c20"), "3.00", Some("NY"));
    third.as_object_mut().expect("object").remove("qty");
    let values = produce(&v3, &[third], &framing);
    let (_, resolutions) = load_spec_detailed(&text, origin, Some(&h.backend))
        .await
        .expect("spec");
    assert_eq!(resolutions[0].kept, ["qty"]);
    assert!(
        resolutions[0]
            .schema
            .skipped
            .iter()
            .any(|s| s.starts_with("tags:")),
        "{:?}",
        resolutions[0].schema.skipped
    );
    let summary = ingestor
        .handle(&event(&records(&topic, 4, values)))
        .await
        .expect("v3 lands");
    assert_eq!(summary.accepted, 1);
    let tables = TableSet::new(
        &load_spec(&text, origin, &h.backend).await.expect("spec"),
        &h.backend.namespace,
    )
    .expect("tables");
    let report = scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(columns(h), with_coupon);
    let last = rows(h, None, 8)
        .into_iter()
        .find(|r| r[0] == "o20")
        .expect("o20");
    assert_eq!(
        last,
        row(&["o20", "c20", "gold", "3.00", "NULL", "PAID", &ts(20), "NY"])
    );
}
