//! A stateful table's SQL changes while its windows are open: the state knows the plan that
//! wrote it, so a new aggregate is carried over (starting at the change), another window is
//! restarted (and `check` refuses it against the live state unless told), and an older
//! release that does not know a table keeps that table's state — never a panic, never a
//! misread accumulator, on the ingest path and in the scheduled stage's idle flush alike.

use streamtable::clock::ManualClock;
use streamtable::generate::SourceRecord;
use streamtable::process::Processor;
use streamtable::spec::PipelineSpec;

use super::{Harness, event};

const BASE_MS: i64 = 1_795_946_400_000; // 10:00:00, a minute boundary
const NOW_MS: i64 = BASE_MS + 3_600_000;

fn order(partition: i32, offset: i64, at_ms: i64, id: &str, amount: &str) -> SourceRecord {
    SourceRecord {
        topic: "orders".into(),
        partition,
        offset,
        timestamp_ms: BASE_MS + at_ms,
        key: Some(id.as_bytes().to_vec()),
        value: Some(
            format!(
                r#"{{"order_id":"{id}","amount":"{amount}","currency":"EUR","country":"DE","status":"paid","created_at":"{}"}}"#,
                streamtable::clock::rfc3339_ms(BASE_MS + at_ms)
            )
            .into_bytes(),
        ),
        raw_value_field: None,
    }
}

/// The shipped spec's orders table and its derived tables, with `edit` applied to the text.
fn spec(edit: impl Fn(String) -> String) -> PipelineSpec {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let text = edit(std::fs::read_to_string(&path).expect("shipped spec"));
    let mut spec =
        PipelineSpec::parse(&text, &path, &streamtable::process::Planner).expect("edited spec");
    spec.retain_tables(|t| t.name == "orders");
    spec
}

const REVENUE: &str = ", SUM(amount) AS revenue";

/// (window start HH:MM, orders, revenue) of the merging view.
async fn windows(h: &Harness) -> Vec<(String, i64, Option<String>)> {
    super::query_rows(
        h,
        "SELECT window_start, CAST(orders AS BIGINT), revenue FROM orders_per_minute ORDER BY 1",
    )
    .await
    .into_iter()
    .map(|r| {
        let start = r[0].clone().unwrap_or_default();
        (
            start.get(11..16).unwrap_or_default().to_string(),
            r[1].as_deref().and_then(|v| v.parse().ok()).unwrap_or(-1),
            r[2].clone(),
        )
    })
    .collect()
}

/// `streamtable check`'s lines about the live state under `spec`, and how many it refuses.
async fn check(h: &Harness, spec: &PipelineSpec, allow: bool) -> (String, usize) {
    let processor = Processor::new(spec).expect("processor");
    streamtable::cli::check::state_plan(&h.backend, spec, &processor, allow)
        .await
        .expect("state plan")
}

pub async fn a_changed_window_sql_is_carried_over_restarted_or_refused_never_a_panic(
    mut h: Harness,
) {
    let clock = ManualClock::new(NOW_MS);
    h.backend.clock = clock.clone();
    let v1 = spec(|t| t.replace(REVENUE, ""));
    let v2 = spec(|t| t);

    // v1 (COUNT only) opens window 10:00 in partition 0.
    h.spec = v1.clone();
    h.ingestor()
        .handle(&event(&[order(0, 0, 5_000, "o-1", "2.00")]))
        .await
        .expect("v1 ingest");

    // `check` of v2 against the live state: carried over, nothing refused.
    let (text, refused) = check(&h, &v2, false).await;
    assert_eq!(refused, 0, "{text}");
    assert!(
        text.contains("orders_per_minute_partials: 1 open windows in 1 partitions carried over; new aggregate `revenue` starts at the change"),
        "{text}"
    );

    // v2 adds SUM(amount): the next record of the open window lands (it panicked with an index
    // out of bounds on every retry before states knew their plan).
    h.spec = v2.clone();
    let summary = h
        .ingestor()
        .handle(&event(&[order(0, 1, 30_000, "o-2", "3.00")]))
        .await
        .expect("v2 ingest of the open window");
    assert_eq!(summary.accepted, 1, "{summary:?}");
    // A record at 10:03 moves partition 0's watermark to 10:02:30: window 10:00 closes.
    h.ingestor()
        .handle(&event(&[order(0, 2, 180_000, "o-3", "5.00")]))
        .await
        .expect("v2 ingest");

    // An older container (v1) still lands a batch in partition 1 (window 10:01 opens there
    // with v1's one accumulator).
    h.spec = v1.clone();
    h.ingestor()
        .handle(&event(&[order(1, 0, 70_000, "o-4", "7.00")]))
        .await
        .expect("v1 ingest in partition 1");

    // The scheduled stage of v2, partition 1 idle: its idle flush closes 10:01 under the new
    // plan (it panicked in the flush before the commit, so no table committed) and commits.
    h.spec = v2.clone();
    clock.advance(600_000);
    let report = streamtable::scheduled::run(&h.backend, &h.tables(), &Default::default())
        .await
        .expect("scheduled run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.idle.partitions, 1, "{:?}", report.idle);
    assert_eq!(
        windows(&h).await,
        vec![
            // Both orders counted; revenue only from the change on.
            ("10:00".to_string(), 2, Some("3.00".to_string())),
            // Opened by v1, closed under v2: no revenue recorded for it.
            ("10:01".to_string(), 1, None),
        ]
    );

    // v3 changes the window to 5 minutes: the open window 10:03 of partition 0 cannot be read
    // by the new plan. `check` refuses unless the loss is accepted.
    let v3 = spec(|t| {
        t.replace(
            "DESCRIPTOR(created_at), INTERVAL '1' MINUTE))",
            "DESCRIPTOR(created_at), INTERVAL '5' MINUTE))",
        )
    });
    let (text, refused) = check(&h, &v3, false).await;
    assert_eq!(refused, 1, "{text}");
    assert!(
        text.contains("! orders_per_minute_partials: the window changed (tumble 60000 ms → tumble 300000 ms): would drop 1 open windows"),
        "{text}"
    );
    assert!(text.contains("deploy the new SQL as a new table"), "{text}");
    let (_, refused) = check(&h, &v3, true).await;
    assert_eq!(refused, 0);
    // Deployed anyway: the partition restarts its windows and goes on.
    h.spec = v3.clone();
    h.ingestor()
        .handle(&event(&[order(0, 3, 190_000, "o-5", "1.00")]))
        .await
        .expect("v3 ingest");
    let (text, refused) = check(&h, &v3, false).await;
    assert_eq!(refused, 0, "the state is v3's now: {text}");
}

pub async fn an_older_release_keeps_the_state_of_a_table_it_does_not_know(mut h: Harness) {
    let clock = ManualClock::new(NOW_MS);
    h.backend.clock = clock.clone();
    let new = spec(|t| t);
    let mut old = new.clone();
    old.derived.retain(|d| d.table.name != "orders_clean");

    // The new release dedups o-1 in orders_clean.
    h.spec = new.clone();
    h.ingestor()
        .handle(&event(&[order(0, 0, 1_000, "o-1", "1.00")]))
        .await
        .expect("new release");
    // An older container (no orders_clean) lands the next batch of the partition.
    h.spec = old.clone();
    h.ingestor()
        .handle(&event(&[order(0, 1, 2_000, "o-2", "1.00")]))
        .await
        .expect("old release");
    // The producer's retry of o-1 reaches the new release again: still a duplicate.
    h.spec = new.clone();
    h.ingestor()
        .handle(&event(&[order(0, 2, 3_000, "o-1", "1.00")]))
        .await
        .expect("new release again");
    streamtable::scheduled::run(&h.backend, &h.tables(), &Default::default())
        .await
        .expect("scheduled run");
    assert_eq!(
        super::count(
            &h,
            "SELECT COUNT(*) FROM orders_clean WHERE order_id = 'o-1'"
        )
        .await,
        1,
        "the older release must not have dropped orders_clean's dedup keys"
    );
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, 3);
}
