//! Idle partitions: a partition that stops receiving records no longer holds its share of the
//! windows back once its table's idle timeout has passed — the scheduled stage closes its
//! windows at the topic's watermark, exactly once, fenced against a batch landing meanwhile.

use streamtable::clock::ManualClock;
use streamtable::generate::SourceRecord;

use super::faults::{Fault, FaultyState};
use super::{Harness, event};

const BASE_MS: i64 = 1_795_946_400_000; // a minute boundary
const NOW_MS: i64 = BASE_MS + 600_000;

/// Orders of `partition` at `offsets`, each `at(offset)` ms after BASE_MS.
fn orders(
    partition: i32,
    offsets: std::ops::Range<i64>,
    at: impl Fn(i64) -> i64,
) -> Vec<SourceRecord> {
    offsets
        .map(|o| SourceRecord {
            topic: "orders".into(),
            partition,
            offset: o,
            timestamp_ms: BASE_MS + at(o),
            key: Some(format!("o-{partition}-{o}").into_bytes()),
            value: Some(
                format!(
                    r#"{{"order_id":"o-{partition}-{o}","amount":"1.00","currency":"EUR","country":"DE","status":"paid","created_at":"{}"}}"#,
                    streamtable::clock::rfc3339_ms(BASE_MS + at(o))
                )
                .into_bytes(),
            ),
            raw_value_field: None,
        })
        .collect()
}

async fn window_counts(h: &Harness) -> Vec<(String, i64)> {
    super::window_counts(h, "orders_per_minute", "orders").await
}

pub async fn idle_partitions_close_their_windows_at_the_topics_watermark(mut h: Harness) {
    h.spec = super::shipped_spec();
    h.spec.retain_tables(|t| t.name == "orders");
    let clock = ManualClock::new(NOW_MS);
    h.backend.clock = clock.clone();
    let tables = h.tables();
    let run = |h: &Harness| {
        let (backend, tables) = (h.backend.clone(), tables.clone());
        async move {
            streamtable::scheduled::run(&backend, &tables, &Default::default())
                .await
                .expect("scheduled run")
        }
    };
    // Partition 0 runs to 4 min 50 s (watermark 4:20: windows 00:00–04:00 closed there);
    // partition 1 stops at 50 s (watermark 0:20: nothing closed) and goes idle.
    let ingestor = h.ingestor();
    let mut first = orders(0, 0..30, |o| o * 10_000);
    first.extend(orders(1, 0..6, |o| o * 10_000));
    ingestor.handle(&event(&first)).await.expect("ingest");
    let report = run(&h).await;
    assert_eq!(report.idle.partitions, 0, "nothing is idle yet");
    assert_eq!(
        window_counts(&h).await,
        [("10:00", 6), ("10:01", 6), ("10:02", 6), ("10:03", 6)].map(|(w, n)| (w.to_string(), n)),
        "partition 1's six orders of 10:00 are held back by its own watermark"
    );

    // Four minutes later partition 1 is not idle yet (timeout 5 min).
    clock.advance(240_000);
    assert_eq!(run(&h).await.idle.partitions, 0);

    // A flush that loses the race with a batch landing in the partition changes nothing.
    clock.advance(120_000);
    let live = h.ingestor();
    let live_event = event(&orders(1, 6..7, |_| 55_000));
    let hook = Fault::Before(Box::new(move || {
        Box::pin(async move {
            live.handle(&live_event).await.expect("live batch");
        })
    }));
    let racing = h.ingestor_with_state(FaultyState::new(h.backend.state.clone(), vec![hook]));
    let raced = racing.flush_idle().await.expect("flush");
    assert_eq!((raced.partitions, raced.raced), (0, 1), "{raced:?}");

    // Idle for 6 minutes after that batch: the scheduled run closes its window 10:00 at the
    // topic's watermark, once.
    clock.advance(360_000);
    let report = run(&h).await;
    assert_eq!(report.idle.partitions, 1, "{:?}", report.idle);
    assert_eq!(report.idle.rows, 1, "one window, one key");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let closed =
        [("10:00", 13), ("10:01", 6), ("10:02", 6), ("10:03", 6)].map(|(w, n)| (w.to_string(), n));
    assert_eq!(
        window_counts(&h).await,
        closed,
        "partition 1's seven orders counted once"
    );
    assert_eq!(run(&h).await.idle.partitions, 0, "nothing left to close");
    assert_eq!(window_counts(&h).await, closed);

    // The partition's watermark moved: a record of 10:00 that comes later is a correction
    // (within the 5 minutes of allowed lateness after 10:01 at watermark 4:20), one of 9:50 —
    // window end 10:00 + 5 min = 10:05 > 4:20 — too; the counts add up.
    h.ingestor()
        .handle(&event(&orders(1, 7..8, |_| 30_000)))
        .await
        .expect("late-ish record");
    run(&h).await;
    assert_eq!(window_counts(&h).await[0], ("10:00".to_string(), 14));
}
