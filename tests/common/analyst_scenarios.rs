//! The analyst's side: SQL agrees with pyiceberg, time travel, read-only, dashboards, Athena
//! compatibility. Run on every backend.

use datafusion::arrow::array::{Array, StringArray};
use streamtable::commit::commit_pending;
use streamtable::query::{QueryEngine, TimeTravel};
use streamtable::scheduled;

use super::table_scenarios::sched;
use super::{Harness, event, records};

/// Every row of `table` through `streamtable query`, in the canonical form of
/// `read_table.py --rows` (timestamps as epoch µs, decimals as text, binary as hex).
pub async fn query_rows(h: &Harness, engine: &QueryEngine, table: &str) -> Vec<Vec<String>> {
    use iceberg::spec::{PrimitiveType, Type};
    let (t, _) = h
        .backend
        .catalog
        .load(&h.tables().ident(table))
        .await
        .expect("load")
        .expect("table");
    let exprs: Vec<String> = t
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            let c = format!("\"{}\"", f.name);
            let e = match f.field_type.as_ref() {
                Type::Primitive(PrimitiveType::Timestamp) => {
                    format!("CAST(CAST({c} AS BIGINT) AS VARCHAR)")
                }
                Type::Primitive(PrimitiveType::Binary) => format!("encode({c}, 'hex')"),
                _ => format!("CAST({c} AS VARCHAR)"),
            };
            format!("COALESCE({e}, 'NULL')")
        })
        .collect();
    let sql = format!("SELECT {} FROM {table}", exprs.join(", "));
    let batches = engine
        .query(&sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut rows = Vec::new();
    for b in batches {
        let cols: Vec<_> = b
            .columns()
            .iter()
            .map(|c| {
                datafusion::arrow::compute::cast(c, &datafusion::arrow::datatypes::DataType::Utf8)
                    .expect("to text")
            })
            .collect();
        let cols: Vec<&StringArray> = cols
            .iter()
            .map(|c| c.as_any().downcast_ref::<StringArray>().expect("strings"))
            .collect();
        for i in 0..b.num_rows() {
            rows.push(
                cols.iter()
                    .map(|c| {
                        if c.is_null(i) {
                            "NULL".into()
                        } else {
                            c.value(i).to_string()
                        }
                    })
                    .collect(),
            );
        }
    }
    rows.sort();
    rows
}

/// 90 changes of the shipped example's order status topic (`orders_current`'s: each order
/// placed, then paid or cancelled, then shipped, cancelled or erased), on 2 partitions.
pub fn order_status_changes() -> Vec<streamtable::generate::SourceRecord> {
    streamtable::cli::synthetic_records(
        &mut streamtable::generate::EventFactory::new(3),
        streamtable::generate::ORDER_STATUS_TOPIC,
        90,
        &mut [0, 0],
        0,
        0,
        1_795_946_400_000,
    )
}

pub fn batch_with_bad_records() -> Vec<streamtable::generate::SourceRecord> {
    // 150 s of orders: the 1-minute windows of orders_per_minute close (watermark − 30 s).
    let mut recs = records("orders", 0, 0..150);
    // Payments for the first 30 orders, 20 s to 10 min after them (order_payments joins them).
    let mut f = streamtable::generate::EventFactory::new(7);
    for o in 0..30i64 {
        let at = 1_795_946_400_000 + o * 1000 + 20_000 + o * 20_000;
        recs.push(streamtable::generate::SourceRecord {
            topic: "payments".into(),
            partition: 1,
            offset: o,
            timestamp_ms: at,
            key: Some(format!("ord-{o:010}").into_bytes()),
            value: Some(f.payment(o as u64, at).into_bytes()),
            raw_value_field: None,
        });
    }
    // 20 readings in 20 s, then one 16 minutes later: the sensors' sessions close.
    recs.extend(records("readings", 2, (0..20).chain([1000])));
    recs[5].value = Some(b"{\"order_id\": true}".to_vec());
    recs[6].value = None;
    recs[7].value = Some(vec![0xff, 0xfe]);
    recs
}

/// `streamtable query` returns exactly what pyiceberg returns, row for row, for every table.
pub async fn query_agrees_with_pyiceberg_on_every_table(h: &Harness) {
    h.ingestor()
        .handle(&event(&batch_with_bad_records()))
        .await
        .expect("ingest");
    scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("run");
    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("engine");
    for table in ["orders", "payments", "readings", "dead_letters"] {
        let ours = query_rows(h, &engine, table).await;
        let theirs = h.pyiceberg_rows(table, None);
        assert!(!ours.is_empty(), "{table} has rows");
        assert_eq!(
            ours, theirs,
            "streamtable query and pyiceberg disagree on {table}"
        );
        h.assert_trino_reads_as_pyiceberg(table, None);
    }
}

/// `--snapshot` and `--as-of` read the tables as they were.
pub async fn time_travel_reads_earlier_snapshots(h: &Harness) {
    let tables = h.tables();
    h.ingestor()
        .handle(&event(&records("orders", 0, 0..10)))
        .await
        .expect("first");
    commit_pending(&h.backend, &tables).await.expect("commit 1");
    let (t1, _) = h
        .backend
        .catalog
        .load(&tables.ident("orders"))
        .await
        .expect("load")
        .expect("table");
    let first = t1.metadata().current_snapshot_id().expect("snapshot");
    let first_ms = t1
        .metadata()
        .current_snapshot()
        .expect("snapshot")
        .timestamp_ms();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    h.ingestor()
        .handle(&event(&records("orders", 0, 10..25)))
        .await
        .expect("second");
    commit_pending(&h.backend, &tables).await.expect("commit 2");

    let count = |engine: QueryEngine| async move {
        let b = engine
            .query("SELECT count(*) AS n FROM orders")
            .await
            .expect("count");
        b[0].column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .expect("n")
            .value(0)
    };
    let now = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("engine");
    assert_eq!(count(now).await, 25);
    let at = QueryEngine::new(&h.backend, TimeTravel::Snapshot(first))
        .await
        .expect("engine");
    assert_eq!(
        query_rows(h, &at, "orders").await,
        h.pyiceberg_rows("orders", Some(first))
    );
    let at = QueryEngine::new(&h.backend, TimeTravel::Snapshot(first))
        .await
        .expect("engine");
    assert_eq!(count(at).await, 10);
    // Trino's `FOR VERSION AS OF` reads the same snapshot (on the AWS backend).
    h.assert_trino_reads_as_pyiceberg("orders", Some(first));
    h.assert_trino_reads_as_pyiceberg("orders", None);
    if let Some(a) = h.trino_one(&format!(
        "SELECT count(*) FROM orders FOR TIMESTAMP AS OF from_unixtime({first_ms} / 1e3 + 0.0005) AT TIME ZONE 'UTC'"
    )) {
        assert_eq!(a.rows, [["10"]], "FOR TIMESTAMP AS OF the first commit");
    }
    let as_of = QueryEngine::new(&h.backend, TimeTravel::AsOf(first_ms))
        .await
        .expect("engine");
    assert_eq!(count(as_of).await, 10);
    let before = QueryEngine::new(&h.backend, TimeTravel::AsOf(first_ms - 3_600_000))
        .await
        .expect("engine");
    assert_eq!(
        count(before).await,
        0,
        "before the first commit the table is empty"
    );
    let missing = QueryEngine::new(&h.backend, TimeTravel::Snapshot(42)).await;
    assert!(missing.is_err_and(|e| e.to_string().contains("snapshot 42")));
}

/// Queries never write, and SQL errors say where they are.
pub async fn queries_are_read_only_and_errors_point_at_the_mistake(h: &Harness) {
    h.ingestor()
        .handle(&event(&records("orders", 0, 0..5)))
        .await
        .expect("ingest");
    scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("run");
    let (before, _) = h
        .backend
        .catalog
        .load(&h.tables().ident("orders"))
        .await
        .expect("load")
        .expect("table");
    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("engine");
    for sql in [
        "INSERT INTO orders SELECT * FROM orders",
        "DELETE FROM orders",
        "DROP TABLE orders",
        "CREATE TABLE copy AS SELECT * FROM orders",
    ] {
        let err = engine.query(sql).await.expect_err(sql);
        assert!(!err.is_retryable());
    }
    let (after, _) = h
        .backend
        .catalog
        .load(&h.tables().ident("orders"))
        .await
        .expect("load")
        .expect("table");
    assert_eq!(
        before.metadata_location(),
        after.metadata_location(),
        "nothing was written"
    );
    let err = engine
        .query("SELECT order_id\nFORM orders")
        .await
        .expect_err("typo");
    let text = err.to_string();
    assert!(text.contains("Line: 2"), "{text}");
    assert!(text.ends_with("  FORM orders\n       ^"), "{text}");
    let err = engine
        .query("SELECT nope FROM orders")
        .await
        .expect_err("unknown column");
    assert!(err.to_string().contains("nope"));
}

/// The dashboards render from the same SQL: one SVG per chart, no network needed (`h` runs the
/// shipped spec: one dashboard reads a derived table).
pub async fn dashboards_render_every_chart(h: &Harness) {
    // The shipped example's topics, order status changes (orders_current's) included.
    let mut recs = batch_with_bad_records();
    recs.extend(order_status_changes());
    h.ingestor().handle(&event(&recs)).await.expect("ingest");
    scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("run");
    // The dashboards show the last 7 days by the backend's clock: a day after these events.
    let mut backend = h.backend.clone();
    backend.clock = streamtable::clock::ManualClock::new(1_795_946_400_000 + 86_400_000);
    let engine = QueryEngine::new(&backend, TimeTravel::Current)
        .await
        .expect("engine");
    let mut results = Vec::new();
    for d in streamtable::cli::dashboard::load(None).expect("dashboards") {
        let batches = engine
            .query(&d.sql)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert!(
            batches.iter().map(|b| b.num_rows()).sum::<usize>() > 0,
            "{} has rows",
            d.name
        );
        results.push((d, batches));
    }
    let html = streamtable::cli::dashboard::render_html(&results, "test").expect("html");
    let charts: usize = results.iter().map(|(d, _)| d.y.len()).sum();
    assert_eq!(html.matches("<svg").count(), charts);
    for (d, _) in &results {
        assert!(html.contains(&d.title.replace('&', "&amp;")), "{}", d.title);
    }
    assert!(
        html.matches("<polyline").count() >= 3,
        "line charts have lines"
    );
    assert!(html.matches("<rect").count() >= 4, "bar charts have bars");
    assert_eq!(
        html.matches("http").count(),
        html.matches("http://www.w3.org/2000/svg").count(),
        "no external resources"
    );

    // Eight days after the events, the event-time dashboards are empty: they read the last 7
    // days only (what lets Athena skip the older partitions).
    backend.clock = streamtable::clock::ManualClock::new(1_795_946_400_000 + 8 * 86_400_000);
    let later = QueryEngine::new(&backend, TimeTravel::Current)
        .await
        .expect("engine");
    for (d, _) in &results {
        if d.sql.contains("FROM dead_letters") {
            continue; // dated by when they were rejected, which is now
        }
        let current_state = h
            .spec
            .tables
            .iter()
            .any(|t| t.upsert.is_some() && d.sql.contains(&format!("FROM {}", t.name)));
        if current_state {
            continue; // an upsert table: the current state of every key, not a period's events
        }
        let rows: usize = later
            .query(&d.sql)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", d.name))
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(rows, 0, "{} reads only the last 7 days", d.name);
    }
}

/// Every table the pipeline writes is one Athena reads.
pub async fn every_table_is_athena_compatible(h: &Harness) {
    h.ingestor()
        .handle(&event(&batch_with_bad_records()))
        .await
        .expect("ingest");
    scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("run");
    for name in h
        .backend
        .catalog
        .pointers()
        .list_tables(&h.backend.namespace)
        .await
        .expect("list")
    {
        let (t, _) = h
            .backend
            .catalog
            .load(&h.tables().ident(&name))
            .await
            .expect("load")
            .expect("table");
        assert_eq!(
            streamtable::athena::compatibility_problems(&name, t.metadata()),
            Vec::<String>::new()
        );
    }
}
