//! The interval join's state stays bounded and a round that cannot finish does not hold the
//! other tables back:
//!
//! - a partition that stops receiving stops holding its side's watermark after its table's
//!   idle timeout, so the other side's rows are forgotten as they would be without it;
//! - past `join_max_kept_rows` the oldest rows are forgotten, counted;
//! - a round that fails (or fails twice, as a crash would) is deferred: its rows wait in the
//!   join's backlog, the intent finishes, the other tables go on, and a later round joins the
//!   backlog once the cause is gone.

use streamtable::Error;
use streamtable::clock::ManualClock;
use streamtable::commit::{CommitOptions, CommitReport, commit_pending_with};
use streamtable::generate::SourceRecord;

use super::{Harness, event};

const BASE_MS: i64 = 1_795_946_400_000;

/// Orders and payments joined within a minute.
const JOIN: &str = r#"
[[derived_tables]]
name = "quick_payments"
sql = """
SELECT o.order_id, p.payment_id, o.created_at, p.attempted_at
FROM orders o JOIN payments p
  ON o.order_id = p.order_id
 AND p.attempted_at BETWEEN o.created_at AND o.created_at + INTERVAL '1' MINUTE
"""
"#;

fn setup(h: &mut Harness) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let text = std::fs::read_to_string(&path).expect("shipped spec") + JOIN;
    h.spec = streamtable::spec::PipelineSpec::parse(&text, &path, &streamtable::process::Planner)
        .expect("spec with the join");
    h.spec
        .retain_tables(|t| t.name == "orders" || t.name == "payments");
    h.spec.derived.retain(|d| d.table.name == "quick_payments");
}

fn order(partition: i32, offset: i64, at_ms: i64) -> SourceRecord {
    SourceRecord {
        topic: "orders".into(),
        partition,
        offset,
        timestamp_ms: BASE_MS + at_ms,
        key: Some(format!("o-{partition}-{offset}").into_bytes()),
        value: Some(format!(
            r#"{{"order_id":"o-{partition}-{offset}","amount":"1.00","currency":"EUR","country":"DE","status":"paid","created_at":"{}"}}"#,
            streamtable::clock::rfc3339_ms(BASE_MS + at_ms)
        ).into_bytes()),
        raw_value_field: None,
    }
}

fn payment(partition: i32, offset: i64, order: &str, at_ms: i64) -> SourceRecord {
    SourceRecord {
        topic: "payments".into(),
        partition,
        offset,
        timestamp_ms: BASE_MS + at_ms,
        key: Some(format!("pay-{partition}-{offset}").into_bytes()),
        value: Some(format!(
            r#"{{"payment_id":"pay-{partition}-{offset}","order_id":"{order}","amount":"1.00","method":"card","status":"ok","attempted_at":"{}"}}"#,
            streamtable::clock::rfc3339_ms(BASE_MS + at_ms)
        ).into_bytes()),
        raw_value_field: None,
    }
}

async fn commit(h: &Harness, options: &CommitOptions) -> CommitReport {
    commit_pending_with(
        &h.backend,
        &h.tables(),
        options,
        Some(std::time::Instant::now() + std::time::Duration::from_secs(120)),
    )
    .await
    .expect("commit")
}

fn join_stats(r: &CommitReport) -> streamtable::commit::JoinStats {
    r.tables
        .iter()
        .find(|t| t.table == "quick_payments")
        .and_then(|t| t.join.clone())
        .expect("the join ran")
}

/// Rounds of 50 orders and their payments on partition 0, a minute of event (and wall) time
/// each; with `stray`, one payment on partition 1 before them, and nothing there after.
/// Returns the rows the join keeps after each round.
async fn kept_rows_per_round(mut h: Harness, stray: bool) -> Vec<u64> {
    setup(&mut h);
    let clock = ManualClock::new(BASE_MS);
    h.backend.clock = clock.clone();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let options = CommitOptions::default();
    if stray {
        h.ingestor()
            .handle(&event(&[payment(1, 0, "nobody", 0)]))
            .await
            .expect("stray payment");
    }
    let mut kept = Vec::new();
    for round in 0..12i64 {
        let mut records = Vec::new();
        for i in 0..50 {
            let offset = round * 50 + i;
            let at = round * 60_000 + i * 1_000;
            records.push(order(0, offset, at));
            records.push(payment(0, offset, &format!("o-0-{offset}"), at + 500));
        }
        h.ingestor().handle(&event(&records)).await.expect("ingest");
        clock.advance(60_000);
        kept.push(join_stats(&commit(&h, &options).await).kept_rows);
    }
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM quick_payments").await,
        600,
        "every order joined its payment once"
    );
    kept
}

pub async fn an_idle_partition_stops_holding_the_joins_watermark(
    with_stray: Harness,
    control: Harness,
) {
    let control = kept_rows_per_round(control, false).await;
    let held = kept_rows_per_round(with_stray, true).await;
    // Before partition 1 of payments goes idle (5 minutes), it holds the payments' watermark
    // at its one row: the orders pile up.
    assert!(held[4] > control[4] + 150, "{held:?} vs {control:?}");
    // Once it is idle, the join keeps what it keeps without it (the stray payment itself is
    // forgotten by the orders' watermark).
    let last = held.len() - 1;
    assert!(
        held[last] <= control[last] + 1,
        "the idle partition still holds the watermark: {held:?} vs {control:?}"
    );
    assert!(
        held[last] < held[4],
        "kept rows shrink once the partition is idle: {held:?}"
    );
}

pub async fn a_join_keeps_at_most_its_bound(mut h: Harness) {
    setup(&mut h);
    let clock = ManualClock::new(BASE_MS);
    h.backend.clock = clock.clone();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let records: Vec<SourceRecord> = (0..100).map(|o| order(0, o, o * 100)).collect();
    h.ingestor().handle(&event(&records)).await.expect("ingest");
    let options = CommitOptions {
        join_max_kept_rows: 30,
        ..Default::default()
    };
    let stats = join_stats(&commit(&h, &options).await);
    assert_eq!(stats.kept_rows, 30, "{stats:?}");
    assert_eq!(stats.evicted_rows, 70, "{stats:?}");
    // The newest are kept: a payment for the last order still joins; one for the first, whose
    // order was forgotten, does not.
    h.ingestor()
        .handle(&event(&[
            payment(0, 0, "o-0-99", 9_950),
            payment(0, 1, "o-0-0", 9_960),
        ]))
        .await
        .expect("payments");
    commit(&h, &options).await;
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM quick_payments").await,
        1,
        "only the kept order joined"
    );
}

pub async fn a_join_round_that_cannot_finish_is_deferred_and_the_others_go_on(mut h: Harness) {
    setup(&mut h);
    // Two days ahead of the wall clock that stamps snapshots: expiry (retention 0) and orphan
    // clean-up find every snapshot and file old.
    let clock = ManualClock::new(streamtable::clock::now_ms() + 2 * 86_400_000);
    h.backend.clock = clock.clone();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let options = CommitOptions::default();
    let pair = |o: i64, at: i64| [order(0, o, at), payment(0, o, &format!("o-0-{o}"), at + 10)];
    // A first round lands and moves the watermarks (to 20 s - 30 s of out-of-orderness).
    let first: Vec<SourceRecord> = (0..10).flat_map(|o| pair(o, 10_000 + o * 1_000)).collect();
    h.ingestor().handle(&event(&first)).await.expect("ingest");
    commit(&h, &options).await;
    clock.advance(60_000);
    // The next batch: ten pairs on time, and one payment far behind the orders' watermark
    // (late: a dead letter of the join).
    let mut records: Vec<SourceRecord> =
        (10..20).flat_map(|o| pair(o, 60_000 + o * 1_000)).collect();
    records.push(payment(0, 20, "o-0-0", -600_000));
    h.ingestor().handle(&event(&records)).await.expect("ingest");

    // The join's round dies twice (as an out-of-memory or a timeout would take the process),
    // after it committed its late rows: every swap of the join table that adds rows fails; the
    // empty snapshot of a deferral goes through.
    let failing = super::faults::HookedPointers::new(
        h.backend.catalog.pointers().clone(),
        Box::new(|table, metadata| {
            let has_rows = metadata.current_snapshot().is_some_and(|s| {
                s.summary()
                    .additional_properties
                    .contains_key("added-records")
            });
            let dies = table == "quick_payments" && has_rows;
            let table = table.to_string();
            Box::pin(async move {
                if dies {
                    Err(Error::Config(format!(
                        "injected: the round of {table} dies"
                    )))
                } else {
                    Ok(())
                }
            })
        }),
    );
    let broken = failing.backend(&h.backend);
    let tables = h.tables();
    let deadline = || Some(std::time::Instant::now() + std::time::Duration::from_secs(60));
    for attempt in 0..2 {
        let e = commit_pending_with(&broken, &tables, &options, deadline())
            .await
            .expect_err("the join's round fails");
        assert!(e.to_string().contains("dies"), "attempt {attempt}: {e}");
    }
    let intent = || async { h.backend.state.commit_intent().await.expect("intent") };
    assert!(intent().await.is_some());
    // The third run defers it: the intent finishes and the topics' tables are committed.
    let report = commit_pending_with(&broken, &tables, &options, deadline())
        .await
        .expect("the round is deferred, the intent finishes");
    assert!(join_stats(&report).deferred, "{report:?}");
    assert!(intent().await.is_none());
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, 20);
    let joined = || async { super::count(&h, "SELECT COUNT(*) FROM quick_payments").await };
    assert_eq!(joined().await, 10, "the first round's pairs only");

    // Later batches commit while the backlog waits (a failed round is retried 10 minutes after
    // the failure, however many rounds wait meanwhile), and the scheduled stage compacts the
    // topics' tables and expires their snapshots: the backlog's files stay.
    let eager = streamtable::scheduled::ScheduledOptions {
        compaction: streamtable::compact::CompactOptions {
            min_input_files: 2,
            ..Default::default()
        },
        maintenance: streamtable::maintenance::MaintenanceOptions {
            keep_last_snapshots: 1,
            snapshot_retention_ms: 0,
            orphan_grace_ms: -1,
            ..Default::default()
        },
        ..Default::default()
    };
    for (step, at) in [(0, 5), (1, 9)] {
        clock.advance(if step == 0 { 5 * 60_000 } else { 4 * 60_000 });
        let more: Vec<SourceRecord> = (0..5)
            .flat_map(|i| {
                let o = 21 + step * 5 + i;
                pair(o, at * 60_000 + i * 1_000)
            })
            .collect();
        h.ingestor().handle(&event(&more)).await.expect("ingest");
        let report = streamtable::scheduled::run(&h.backend, &h.tables(), &eager)
            .await
            .expect("scheduled run");
        assert!(
            report
                .commit
                .tables
                .iter()
                .any(|t| t.join.as_ref().is_some_and(|j| j.deferred)),
            "still waiting at {at} min: {report:?}"
        );
    }
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, 30);

    // Eleven minutes after the failure, the next round joins the backlog and its own rows,
    // once each, and writes the late payment's dead letter only once.
    clock.advance(2 * 60_000);
    h.ingestor()
        .handle(&event(&pair(31, 11 * 60_000)))
        .await
        .expect("ingest");
    let report = commit(&h, &options).await;
    let stats = join_stats(&report);
    assert!(!stats.deferred, "{stats:?}");
    assert_eq!(stats.backlog_files_lost, 0, "{stats:?}");
    assert_eq!(joined().await, 31);
    assert_eq!(
        super::count(&h, "SELECT COUNT(DISTINCT payment_id) FROM quick_payments").await,
        31
    );
    assert_eq!(
        super::count(
            &h,
            "SELECT COUNT(*) FROM dead_letters WHERE error_kind = 'late' AND kafka_offset = 20"
        )
        .await,
        1,
        "the late payment is one dead letter"
    );
}

/// A round deferred before it wrote its late rows, then a later attempt that wrote them (its own
/// and the backlog's) before failing: the round that finally joins the backlog writes none of
/// those dead letters again.
pub async fn late_rows_of_deferred_rounds_are_dead_lettered_once(mut h: Harness) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    setup(&mut h);
    let clock = ManualClock::new(streamtable::clock::now_ms() + 2 * 86_400_000);
    h.backend.clock = clock.clone();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let options = CommitOptions::default();
    let pair = |o: i64, at: i64| [order(0, o, at), payment(0, o, &format!("o-0-{o}"), at + 10)];
    let first: Vec<SourceRecord> = (0..10).flat_map(|o| pair(o, 10_000 + o * 1_000)).collect();
    h.ingestor().handle(&event(&first)).await.expect("ingest");
    commit(&h, &options).await;

    // Which swaps fail: 1 = the dead letters' (the round dies before its late rows land),
    // 2 = the join table's (it dies after), 0 = none.
    let mode = Arc::new(AtomicU8::new(1));
    let failing = {
        let mode = mode.clone();
        super::faults::HookedPointers::new(
            h.backend.catalog.pointers().clone(),
            Box::new(move |table, metadata| {
                let has_rows = metadata.current_snapshot().is_some_and(|s| {
                    s.summary()
                        .additional_properties
                        .contains_key("added-records")
                });
                let dies = has_rows
                    && match mode.load(Ordering::SeqCst) {
                        1 => table == "dead_letters",
                        2 => table == "quick_payments",
                        _ => false,
                    };
                let table = table.to_string();
                Box::pin(async move {
                    if dies {
                        Err(Error::Config(format!("injected: the swap of {table} dies")))
                    } else {
                        Ok(())
                    }
                })
            }),
        )
    };
    let broken = failing.backend(&h.backend);
    let tables = h.tables();
    let deadline = || Some(std::time::Instant::now() + std::time::Duration::from_secs(60));
    let (broken, tables, options) = (&broken, &tables, &options);
    let defer = |expect: &str| {
        let expect = expect.to_string();
        async move {
            for _ in 0..2 {
                let e = commit_pending_with(broken, tables, options, deadline())
                    .await
                    .expect_err("the round dies");
                assert!(e.to_string().contains(&expect), "{e}");
            }
            let report = commit_pending_with(broken, tables, options, deadline())
                .await
                .expect("deferred");
            assert!(join_stats(&report).deferred, "{report:?}");
        }
    };
    // Round 1 (a late payment in it) dies before its late rows land, twice: deferred.
    clock.advance(60_000);
    let mut r1: Vec<SourceRecord> = (10..15).flat_map(|o| pair(o, 60_000 + o * 1_000)).collect();
    r1.push(payment(0, 15, "o-0-0", -600_000));
    h.ingestor().handle(&event(&r1)).await.expect("ingest");
    defer("dead_letters").await;
    // Eleven minutes on, round 2 (another late payment) is tried with the backlog: its late rows
    // — round 1's and its own — land, then the join table's swap dies, twice: deferred again.
    clock.advance(11 * 60_000);
    mode.store(2, Ordering::SeqCst);
    let mut r2: Vec<SourceRecord> = (16..20).flat_map(|o| pair(o, 70_000 + o * 1_000)).collect();
    r2.push(payment(0, 20, "o-0-1", -600_000));
    h.ingestor().handle(&event(&r2)).await.expect("ingest");
    defer("quick_payments").await;
    let late = || async {
        super::count(
            &h,
            "SELECT COUNT(*) FROM dead_letters WHERE error_kind = 'late'",
        )
        .await
    };
    assert_eq!(late().await, 2, "both late payments, once");
    // Eleven more minutes: the backlog is joined, and no late row is written twice.
    clock.advance(11 * 60_000);
    mode.store(0, Ordering::SeqCst);
    h.ingestor()
        .handle(&event(&pair(21, 90_000)))
        .await
        .expect("ingest");
    let report = commit(&h, options).await;
    assert!(!join_stats(&report).deferred, "{report:?}");
    assert_eq!(late().await, 2, "both late payments, still once");
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM quick_payments").await,
        20,
        "every on-time pair joined once"
    );
}

/// An outage (a retryable error: throttling, a timeout) during a join round is not an attempt of
/// the round's own: however many commits it fails, the round is resumed, never deferred.
pub async fn an_outage_during_a_join_round_does_not_defer_it(mut h: Harness) {
    setup(&mut h);
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let options = CommitOptions::default();
    let pairs: Vec<SourceRecord> = (0..10)
        .flat_map(|o| {
            let at = BASE_MS + o * 1_000;
            [order(0, o, at), payment(0, o, &format!("o-0-{o}"), at + 10)]
        })
        .collect();
    h.ingestor().handle(&event(&pairs)).await.expect("ingest");
    // The dead letters' table (read in the middle of the join round) is out three times.
    let failing = super::faults::HookedPointers::new(
        h.backend.catalog.pointers().clone(),
        Box::new(|_, _| Box::pin(async { Ok(()) })),
    );
    failing.fail_reads("dead_letters", 3);
    let broken = failing.backend(&h.backend);
    let tables = h.tables();
    let deadline = || Some(std::time::Instant::now() + std::time::Duration::from_secs(60));
    for n in 0..3 {
        let e = commit_pending_with(&broken, &tables, &options, deadline())
            .await
            .expect_err("the outage fails the run");
        assert!(e.is_retryable(), "outage {n}: {e}");
    }
    let report = commit_pending_with(&broken, &tables, &options, deadline())
        .await
        .expect("the outage is over");
    let stats = join_stats(&report);
    assert!(
        !stats.deferred,
        "three outages are no failures of the round: {report:?}"
    );
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM quick_payments").await,
        10,
        "every pair joined once"
    );
}
