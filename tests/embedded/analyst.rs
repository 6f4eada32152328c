//! The analyst's side on the embedded backend: SQL, time travel, dashboards, Athena rules, and
//! the demo through the real binary.

use crate::common;
use crate::common::analyst_scenarios as a;

#[tokio::test]
async fn query_agrees_with_pyiceberg_on_every_table() {
    a::query_agrees_with_pyiceberg_on_every_table(&common::embedded().await).await;
}

#[tokio::test]
async fn time_travel_reads_earlier_snapshots() {
    a::time_travel_reads_earlier_snapshots(&common::embedded().await).await;
}

#[tokio::test]
async fn queries_are_read_only_and_errors_point_at_the_mistake() {
    a::queries_are_read_only_and_errors_point_at_the_mistake(&common::embedded().await).await;
}

#[tokio::test]
async fn dashboards_render_every_chart() {
    let mut h = common::embedded().await;
    h.spec = common::shipped_spec();
    a::dashboards_render_every_chart(&h).await;
}

#[tokio::test]
async fn every_table_is_athena_compatible() {
    a::every_table_is_athena_compatible(&common::embedded().await).await;
}

fn streamtable(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_streamtable"))
        .arg("--home")
        .arg(home)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("STREAMTABLE_BACKEND")
        .output()
        .expect("run streamtable")
}

/// The README's first command, end to end, then the analyst's commands on what it made.
#[test]
fn the_demo_answers_the_dashboard_questions_and_the_tables_are_queryable() {
    let home = tempfile::tempdir().expect("home");
    let out = streamtable(home.path(), &["demo", "--events", "3000"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for d in streamtable::cli::dashboard::load(None).expect("dashboards") {
        assert!(
            text.contains(&d.title),
            "demo answers {:?}:\n{text}",
            d.title
        );
    }
    assert!(
        text.contains("already_seen=") && !text.contains("already_seen=0 "),
        "re-deliveries were skipped:\n{text}"
    );
    assert!(text.contains("dead letters: "), "{text}");
    // One topic is produced as Avro behind a registry: its good records land like the JSON
    // topics' do; the producer's bad records (not Avro) are dead letters that say so.
    assert!(
        text.contains("topic readings is produced as Avro") && text.contains("no_schema_id="),
        "{text}"
    );
    let out = streamtable(
        home.path(),
        &[
            "query",
            "SELECT count(*) AS n, count(DISTINCT sensor_id) AS sensors FROM readings",
            "--format",
            "json",
        ],
    );
    assert!(out.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    // Every good reading once (one in 250 is bad) plus the producer's 15 re-sent copies (ids 0,
    // 211, …, 2954), as the JSON topics land them.
    assert_eq!(
        rows[0]["n"],
        3000 - 3000 / 250 + 15,
        "every good reading, decoded from Avro"
    );

    let out = streamtable(
        home.path(),
        &[
            "query",
            "SELECT count(DISTINCT order_id) AS n, count(*) - count(DISTINCT order_id) AS copies FROM orders",
            "--format",
            "json",
        ],
    );
    assert!(out.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(rows[0]["n"], 3000 - 3000 / 250, "every good order once");
    // The demo's producer re-sends one order in 211 (ids 0, 211, …, 2954): the raw table keeps
    // the copies, orders_clean drops them.
    assert_eq!(
        rows[0]["copies"], 15,
        "the producer's copies land in the raw table"
    );

    // orders_current holds each order's last status change, erased orders gone: the state
    // that follows from the topic's records in order (the demo's 3,000 events fit one batch,
    // its every 250th record is bad: a tombstone, which erases its key, or a dead letter).
    let mut model = std::collections::BTreeMap::new();
    for n in 0..3000u64 {
        let (k, step) = streamtable::generate::status_event(n);
        let id = streamtable::generate::order_id(k);
        let status = if n % 250 == 249 {
            if (n / 250) % 8 != 1 {
                continue;
            }
            None
        } else {
            streamtable::generate::order_status(k, step)
        };
        match status {
            Some(s) => model.insert(id, s),
            None => model.remove(&id),
        };
    }
    let mut want = std::collections::BTreeMap::<&str, i64>::new();
    for s in model.values() {
        *want.entry(s).or_default() += 1;
    }
    assert!(want.len() == 4, "every status is in the model: {want:?}");
    let out = streamtable(
        home.path(),
        &[
            "query",
            "SELECT status, count(*) AS n, count(DISTINCT order_id) AS ids FROM orders_current GROUP BY 1 ORDER BY 1",
            "--format",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let got: std::collections::BTreeMap<&str, i64> = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            assert_eq!(r["n"], r["ids"], "one row per order: {r}");
            (
                r["status"].as_str().unwrap_or("?"),
                r["n"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(got, want, "orders_current is the last status of each order");
    let out = streamtable(
        home.path(),
        &[
            "query",
            &format!(
                "SELECT count(*) AS n FROM orders_current WHERE order_id NOT IN ({})",
                model
                    .keys()
                    .map(|k| format!("'{k}'"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "--format",
            "json",
        ],
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(rows[0]["n"], 0, "erased orders are gone");

    // Every offset the demo delivered is in its table or dead_letters once; the upsert table's
    // records are each a row (deleted ones too), a tombstone or a row compaction dropped.
    let out = streamtable(home.path(), &["audit"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let upsert = text
        .split("table orders_current (topic order_status)")
        .nth(1)
        .unwrap_or_default();
    assert!(
        upsert.contains("tombstones") && upsert.contains("every delivered record accounted for"),
        "{text}"
    );
    assert!(
        text.contains("in its table or dead_letters exactly once"),
        "{text}"
    );

    let out = streamtable(home.path(), &["tables", "--json"]);
    let tables: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = tables
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "currency_rates",
            "dead_letters",
            "order_payments",
            "orders",
            "orders_clean",
            "orders_current",
            "orders_per_minute_partials",
            "payments",
            "readings",
            "readings_alerts",
            "sensor_sessions_partials"
        ]
    );
    assert!(tables[3]["newest_event_ms"].as_i64().is_some());

    // The derived tables landed exactly once, through the same binary: orders_clean is the
    // orders that were not cancelled, each once, every one converted to EUR.
    let out = streamtable(
        home.path(),
        &[
            "query",
            "SELECT (SELECT count(*) FROM orders_clean) AS clean, \
                    (SELECT count(DISTINCT order_id) FROM orders WHERE status IS DISTINCT FROM 'cancelled') AS expected, \
                    (SELECT sum(orders) FROM orders_per_minute) AS windowed, \
                    (SELECT count(*) FROM orders) AS raw, \
                    (SELECT count(*) FROM dead_letters WHERE error_kind = 'late' \
                       AND error_message LIKE 'derived table orders_per_minute: %') AS late, \
                    (SELECT count(DISTINCT order_id) FROM orders_clean) AS distinct_ids, \
                    (SELECT count(*) FROM orders_clean WHERE amount_eur IS NULL) AS unconverted, \
                    (SELECT count(*) FROM readings_alerts) AS alerts, \
                    (SELECT count(*) FROM readings WHERE temperature >= 35) AS hot",
            "--format",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let n = |k: &str| r[0][k].as_i64().unwrap_or(-1);
    assert!(n("clean") > 0 && n("clean") < 3000 - 3000 / 250, "{r}");
    assert_eq!(n("clean"), n("expected"), "{r}");
    assert_eq!(n("distinct_ids"), n("clean"), "{r}");
    // orders_per_minute: closed windows hold the orders that were not too late; the demo sends
    // some 7 minutes late, past the 5 minutes of allowed lateness.
    assert!(
        n("windowed") > 0 && n("windowed") <= n("raw") - n("late"),
        "{r}"
    );
    assert!(n("late") > 0, "{r}");
    assert_eq!(n("unconverted"), 0, "{r}");
    assert!(n("alerts") > 0, "{r}");
    assert_eq!(n("alerts"), n("hot"), "{r}");

    // order_payments (the interval join, run by the scheduled stage) is the batch join over
    // the raw tables, pair for pair, except pairs with a row that came too late for the join
    // (a dead letter of kind late); sensor_sessions holds each session once and counts only
    // readings.
    let out = streamtable(
        home.path(),
        &[
            "query",
            "WITH b AS (SELECT o.order_id, p.payment_id, o.kafka_partition AS op, o.kafka_offset AS oo, \
                               p.kafka_partition AS pp, p.kafka_offset AS po \
                        FROM orders o JOIN payments p ON o.order_id = p.order_id \
                         AND p.attempted_at BETWEEN o.created_at AND o.created_at + INTERVAL '1' HOUR), \
                  late AS (SELECT topic, kafka_partition, kafka_offset FROM dead_letters \
                           WHERE error_kind = 'late' AND error_message LIKE 'interval join order_payments: %'), \
                  b_late AS (SELECT b.* FROM b WHERE EXISTS (SELECT 1 FROM late l WHERE \
                               (l.topic = 'orders' AND l.kafka_partition = b.op AND l.kafka_offset = b.oo) OR \
                               (l.topic = 'payments' AND l.kafka_partition = b.pp AND l.kafka_offset = b.po))) \
             SELECT (SELECT count(*) FROM b) AS batch, \
                    (SELECT count(*) FROM b_late) AS batch_late, \
                    (SELECT count(*) FROM order_payments) AS joined, \
                    (SELECT count(*) FROM (SELECT order_id, payment_id FROM b EXCEPT ALL SELECT order_id, payment_id FROM b_late \
                                           EXCEPT ALL SELECT order_id, payment_id FROM order_payments)) AS missing, \
                    (SELECT count(*) FROM (SELECT order_id, payment_id FROM order_payments EXCEPT ALL SELECT order_id, payment_id FROM b)) AS extra, \
                    (SELECT count(*) FROM sensor_sessions) AS sessions, \
                    (SELECT count(*) FROM (SELECT DISTINCT sensor_id, session_start FROM sensor_sessions)) AS distinct_sessions, \
                    (SELECT sum(readings) FROM sensor_sessions) AS in_sessions, \
                    (SELECT count(*) FROM readings) AS readings, \
                    (SELECT count(*) FROM sensor_sessions WHERE session_end <= session_start) AS empty_sessions",
            "--format",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let n = |k: &str| r[0][k].as_i64().unwrap_or(-1);
    assert!(n("joined") > 0, "{r}");
    assert_eq!(
        n("extra"),
        0,
        "every joined row is a pair of the batch join: {r}"
    );
    assert_eq!(
        n("missing"),
        0,
        "every pair of the batch join is joined or has a late row: {r}"
    );
    assert_eq!(n("joined") + n("batch_late"), n("batch"), "{r}");
    assert!(n("sessions") > 0, "{r}");
    assert_eq!(n("sessions"), n("distinct_sessions"), "{r}");
    assert!(
        n("in_sessions") > 0 && n("in_sessions") <= n("readings"),
        "{r}"
    );
    assert_eq!(n("empty_sessions"), 0, "{r}");

    let file = home.path().join("dash.html");
    let out = streamtable(
        home.path(),
        &["dashboard", "--out", file.to_str().expect("path")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read_to_string(&file)
            .expect("html")
            .contains("<svg")
    );

    let out = streamtable(home.path(), &["query", "SELEC 1"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a bad query is not a retryable fault"
    );
}
