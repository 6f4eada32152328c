//! Trino — the engine of Athena engine 3 — as the analysts' reader, on the moto server
//! (`scripts/trino-local`, started by `scripts/test`): every table and every windowed view of the
//! shipped pipeline read through Glue and S3, equal to pyiceberg and `streamtable query`; day
//! partitions pruned; and every query analysts are handed (the dashboards, the Athena named
//! queries and the QuickSight datasets of `template.yaml`) run over the demo's tables with the
//! answers of `streamtable query`. The shared scenarios (time travel, schema evolution, structs)
//! check Trino too on this backend (`Harness::assert_trino_reads_as_pyiceberg`).

use std::path::Path;

use streamtable::query::{QueryEngine, TimeTravel};
use streamtable::scheduled;

use crate::common;
use crate::common::analyst_scenarios::batch_with_bad_records;
use crate::common::table_scenarios::sched;
use crate::common::trino::{TrinoAnswer, assert_same_answer, query_answer};

/// A window computing every aggregate a window may (the sketch of `approx_distinct` among
/// them), added to the shipped pipeline: its view merges each kind of partial column.
const EVERY_AGGREGATE: &str = r#"
[[derived_tables]]
name = "orders_stats"
sql = """
SELECT window_start, window_end, country, COUNT(*) AS orders, SUM(amount) AS revenue,
       MIN(amount) AS smallest, MAX(created_at) AS last_order, AVG(amount) AS mean_amount,
       approx_distinct(customer_id) AS customers
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, country
"""
"#;

/// HyperLogLog's standard error with the 2048 buckets of `approx_distinct` is 2.3%: three
/// standard errors between two implementations' estimates of the same sketch.
const SKETCH_TOLERANCE: f64 = 0.069;

fn shipped_with(extra: &str) -> streamtable::spec::PipelineSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let text = std::fs::read_to_string(&path).expect("shipped spec") + extra;
    streamtable::spec::PipelineSpec::parse(&text, &path, &streamtable::process::Planner)
        .expect("spec")
}

fn names(answer: &TrinoAnswer) -> Vec<String> {
    answer.rows.iter().map(|r| r[0].clone()).collect()
}

#[tokio::test]
async fn trino_reads_every_table_and_view_of_the_pipeline() {
    let mut h = common::moto().await;
    h.spec = shipped_with(EVERY_AGGREGATE);
    // The reference table with rows, so that it and the enrichment reading it are checked.
    streamtable::references::append_rows(
        &h.backend,
        &h.tables(),
        "currency_rates",
        &streamtable::generate::currency_rates().expect("rates"),
    )
    .await
    .expect("append rates");
    let mut recs = batch_with_bad_records();
    recs.extend(common::analyst_scenarios::order_status_changes());
    h.ingestor()
        .handle(&common::event(&recs))
        .await
        .expect("ingest");
    let report = scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let database = h.glue_database().expect("moto");

    let listed = h
        .trino_one("SHOW TABLES")
        .expect("Trino on the AWS backend");
    let views = h
        .trino_one(&format!(
            "SELECT table_name FROM information_schema.views WHERE table_schema = '{database}' ORDER BY 1"
        ))
        .expect("Trino");
    let views = names(&views);
    assert_eq!(
        views,
        ["orders_per_minute", "orders_stats", "sensor_sessions"],
        "the windowed tables' views, as Trino lists them from Glue"
    );
    let tables: Vec<String> = names(&listed)
        .into_iter()
        .filter(|t| !views.contains(t))
        .collect();
    for expected in [
        "orders",
        "payments",
        "readings",
        "dead_letters",
        "orders_clean",
        "order_payments",
        "readings_alerts",
        "currency_rates",
        "orders_per_minute_partials",
        "orders_stats_partials",
        "sensor_sessions_partials",
        "orders_current",
    ] {
        assert!(
            tables.iter().any(|t| t == expected),
            "Trino lists {expected}: {tables:?}"
        );
    }

    // Every table, every column of every row, as pyiceberg reads it (dead letters' binary
    // columns, decimals, timestamps, the Kafka columns included).
    for t in &tables {
        h.assert_trino_reads_as_pyiceberg(t, None);
    }
    for t in &tables {
        assert!(
            !h.trino_rows(t, None).expect("Trino").is_empty(),
            "{t} has rows (a comparison of two empty tables checks nothing)"
        );
    }
    let enriched = h
        .trino_one("SELECT count(*) FROM orders_clean WHERE amount_eur IS NOT NULL")
        .expect("Trino");
    assert_ne!(
        enriched.rows,
        vec![vec!["0".to_string()]],
        "orders_clean is enriched"
    );

    // Every view, through its Athena definition in Glue, as `streamtable query` answers it.
    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("engine");
    for v in &views {
        let sql = format!("SELECT * FROM {v}");
        let theirs = h.trino_one(&sql).expect("Trino");
        let ours = query_answer(&engine, &sql).await;
        assert!(!ours.is_empty(), "{v} has closed windows");
        assert_same_answer(
            &format!("view {v}"),
            &theirs,
            ours,
            false,
            &[("customers", SKETCH_TOLERANCE)],
        );
    }
    // The view's column types are the ones its Glue definition declares (Trino checks them
    // when it expands the view; these are what QuickSight and JDBC clients see).
    let described = h.trino_one("DESCRIBE orders_stats").expect("Trino");
    let types: Vec<(String, String)> = described
        .rows
        .iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    assert_eq!(
        types,
        [
            ("window_start", "timestamp(6)"),
            ("window_end", "timestamp(6)"),
            ("country", "varchar"),
            ("orders", "bigint"),
            ("revenue", "decimal(38,2)"),
            ("smallest", "decimal(18,2)"),
            ("last_order", "timestamp(6)"),
            ("mean_amount", "double"),
            ("customers", "bigint"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );

    // Day partitions: a predicate on the partition source column at a day's boundary is a
    // constraint Trino hands to the scan (whole partitions in or out), and the partitions it
    // prunes by are the table's days.
    let plan = h
        .trino_one(
            "EXPLAIN SELECT count(*) FROM orders WHERE created_at >= TIMESTAMP '2026-11-29 00:00:00'",
        )
        .expect("Trino");
    let plan = &plan.rows[0][0];
    assert!(
        plan.contains("constraint on [created_at]")
            && plan.contains("[[2026-11-29 00:00:00.000000, <max>)]"),
        "{plan}"
    );
    let partitions = h
        .trino_one("SELECT CAST(partition.created_at_day AS varchar), record_count, file_count FROM \"orders$partitions\"")
        .expect("Trino");
    assert_eq!(partitions.rows.len(), 1, "{partitions:?}");
    assert_eq!(partitions.rows[0][0], "2026-11-29");
    let sql = "SELECT count(*) AS n FROM orders WHERE created_at >= TIMESTAMP '2026-11-30 00:00:00' \
               UNION ALL SELECT count(*) FROM orders WHERE created_at < TIMESTAMP '2026-11-30 00:00:00'";
    let in_range = h.trino_one(sql).expect("Trino");
    let ours = query_answer(&engine, sql).await;
    assert_same_answer("day-column predicates", &in_range, ours, false, &[]);
    assert!(
        in_range.rows.contains(&vec!["0".to_string()]),
        "{in_range:?}"
    );
}

/// The SQL blocks of `template.yaml` under `key: |` (`QueryString` of the Athena named queries,
/// `SqlQuery` of the QuickSight datasets), each with the resource it belongs to.
fn template_sql(key: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("template.yaml"))
        .expect("template.yaml");
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut resource = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        if indent == 2 && line.trim_end().ends_with(':') && !line.trim().starts_with('#') {
            resource = line.trim().trim_end_matches(':').to_string();
        }
        if line.trim() == format!("{key}: |") {
            let mut sql = Vec::new();
            i += 1;
            while i < lines.len() {
                let l = lines[i];
                let ind = l.len() - l.trim_start().len();
                if !l.trim().is_empty() && ind <= indent {
                    break;
                }
                sql.push(l.trim_start());
                i += 1;
            }
            out.push((resource.clone(), sql.join("\n").trim().to_string()));
            continue;
        }
        i += 1;
    }
    out
}

#[tokio::test]
async fn every_query_analysts_are_handed_runs_in_trino_with_our_answers() {
    let h = common::moto().await;
    let state = common::state_table(&h);
    let database = h.glue_database().expect("moto");
    let demo = format!("{database}_demo");
    // The demo, on this stack's bucket and state table, into its own Glue database.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_streamtable"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("STREAMTABLE_BACKEND", "aws")
        .env("STREAMTABLE_BUCKET", &state)
        .env("STREAMTABLE_STATE_TABLE", &state)
        .env("STREAMTABLE_GLUE_DATABASE", &database)
        .args(["demo", "--events", "3000", "--namespace", &demo])
        .args(["--topic-prefix", "demo-"])
        .output()
        .expect("run the demo");
    assert!(
        out.status.success(),
        "demo on moto: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut backend = h.backend.clone();
    backend.namespace = demo.clone();
    let engine = QueryEngine::new(&backend, TimeTravel::Current)
        .await
        .expect("engine");
    let mut demo_h = common::Harness {
        backend: backend.clone(),
        spec: h.spec.clone(),
        _home: None,
        catalog_args: h.catalog_args.clone(),
    };
    let at = demo_h
        .catalog_args
        .iter()
        .position(|a| a == "--database")
        .expect("database");
    demo_h.catalog_args[at + 1] = demo.clone();

    // Every demo table has rows, and Trino reads each as pyiceberg does.
    for t in [
        "orders",
        "payments",
        "readings",
        "dead_letters",
        "orders_clean",
        "order_payments",
        "readings_alerts",
        "currency_rates",
        "orders_per_minute_partials",
        "sensor_sessions_partials",
        "orders_current",
    ] {
        let rows = demo_h.trino_rows(t, None).expect("Trino");
        assert!(!rows.is_empty(), "the demo's {t} has rows");
        demo_h.assert_trino_reads_as_pyiceberg(t, None);
    }

    let mut queries: Vec<(String, String)> = streamtable::cli::dashboard::load(None)
        .expect("dashboards")
        .into_iter()
        .map(|d| (format!("infra/dashboards/{}", d.name), d.sql))
        .collect();
    let named = template_sql("QueryString");
    let datasets = template_sql("SqlQuery");
    // Every block of the template is found (one written another way would be skipped).
    let template =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("template.yaml"))
            .expect("template.yaml");
    let written = |key: &str| {
        template
            .lines()
            .filter(|l| l.trim_start().starts_with(&format!("{key}:")))
            .count()
    };
    assert_eq!(named.len(), written("QueryString"), "{named:?}");
    assert_eq!(datasets.len(), written("SqlQuery"), "{datasets:?}");
    assert!(
        named.len() >= 7 && datasets.len() >= 7,
        "{named:?} {datasets:?}"
    );
    queries.extend(
        named
            .into_iter()
            .map(|(r, s)| (format!("named query {r}"), s)),
    );
    queries.extend(
        datasets
            .into_iter()
            .map(|(r, s)| (format!("QuickSight {r}"), s)),
    );
    // The audit query shipped for analysts: the same answer in Trino, and nothing wrong.
    let audit_sql = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/athena/audit_orders.sql"),
    )
    .expect("infra/athena/audit_orders.sql")
    // The demo's orders come from its own topic (`--topic-prefix demo-`).
    .replace("topic = 'orders'", "topic = 'demo-orders'");
    assert!(
        audit_sql.contains("'demo-orders'"),
        "the topic is named once"
    );
    let audit = query_answer(&engine, &audit_sql).await;
    assert!(!audit.is_empty(), "the audit answers per partition");
    for row in &audit {
        assert_eq!(
            row[5..],
            ["0".to_string(), "0".to_string()],
            "no offset missing or twice: {row:?}"
        );
    }
    queries.push(("infra/athena/audit_orders.sql".into(), audit_sql));
    let sqls: Vec<&str> = queries.iter().map(|(_, s)| s.as_str()).collect();
    let answers = demo_h.trino(&sqls).expect("Trino");
    for ((what, sql), theirs) in queries.iter().zip(&answers) {
        if let Some(e) = &theirs.error {
            panic!("{what} fails in Trino: {e}\n{sql}");
        }
        let ours = query_answer(&engine, sql).await;
        assert!(!ours.is_empty(), "{what} answers rows");
        assert_same_answer(what, theirs, ours, true, &[]);
    }
}

/// Rows an analyst deletes in Athena (its `DELETE` writes position delete files, as Trino's does)
/// stay deleted when compaction rewrites their files: compaction applies the deletes and drops
/// the delete files, instead of copying the rows back.
#[tokio::test]
async fn rows_an_analyst_deletes_stay_deleted_through_compaction() {
    let h = common::moto().await;
    let tables = h.tables();
    for i in 0..4i64 {
        h.ingestor()
            .handle(&common::event(&common::records(
                "orders",
                0,
                i * 10..(i + 1) * 10,
            )))
            .await
            .expect("ingest");
        streamtable::commit::commit_pending(&h.backend, &tables)
            .await
            .expect("commit");
    }
    let count = |h: &common::Harness| {
        h.trino_one("SELECT count(*) FROM orders")
            .expect("Trino")
            .rows[0][0]
            .clone()
    };
    assert_eq!(count(&h), "40");
    h.trino_one("DELETE FROM orders WHERE kafka_offset % 4 = 0")
        .expect("Trino");
    assert_eq!(count(&h), "30", "Trino's DELETE removed 10 rows");
    let py = h.read_external("pyiceberg", "orders");
    assert_eq!(
        py["count"], 30,
        "pyiceberg applies Trino's position deletes"
    );
    let last = |v: &serde_json::Value, key: &str| -> String {
        v["snapshots"]
            .as_array()
            .and_then(|s| s.last())
            .expect("snapshots")["summary"][key]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_ne!(
        last(&py, "total-delete-files"),
        "0",
        "the DELETE wrote delete files"
    );

    let done = streamtable::compact::compact_all(
        &h.backend,
        &tables,
        &streamtable::compact::CompactOptions {
            min_input_files: 2,
            ..Default::default()
        },
    )
    .await
    .expect("compact");
    assert!(
        done.iter().any(|c| c.snapshot_id.is_some()),
        "compaction rewrote the files: {done:?}"
    );
    assert_eq!(count(&h), "30", "Trino after compaction");
    let py = h.read_external("pyiceberg", "orders");
    assert_eq!(py["count"], 30, "pyiceberg after compaction");
    assert_eq!(
        last(&py, "total-delete-files"),
        "0",
        "the delete files are applied and gone"
    );
    assert_eq!(
        last(&py, "total-records"),
        "30",
        "the files hold only the rows left"
    );
    let kept: Vec<i64> = py["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k[1].as_i64().expect("offset"))
        .collect();
    assert!(
        kept.iter().all(|o| o % 4 != 0),
        "no deleted row came back: {kept:?}"
    );
    h.assert_trino_reads_as_pyiceberg("orders", None);
}
