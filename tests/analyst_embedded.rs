//! The analyst's side on the embedded backend: SQL, time travel, dashboards, Athena rules, and
//! the demo through the real binary.

mod common;

use common::analyst_scenarios as a;

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
            "orders",
            "orders_clean",
            "orders_per_minute_partials",
            "payments",
            "readings",
            "readings_alerts"
        ]
    );
    assert!(tables[2]["newest_event_ms"].as_i64().is_some());

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
