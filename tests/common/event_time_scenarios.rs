//! Event time that cannot be believed, and idle partitions among active ones:
//!
//! - a record stamped far ahead of its Kafka timestamp (year 9999) lands in the topic's table
//!   but does not move its partition's watermark: the records after it are not late, their
//!   window closes when the real event times say so, and each stateful table has a `future`
//!   dead letter for it;
//! - an idle partition moves to the lowest watermark of the partitions still receiving (Flink
//!   leaves idle inputs out of the minimum), not to the most advanced one's.

use streamtable::clock::ManualClock;
use streamtable::generate::SourceRecord;

use super::{Harness, event};

const BASE_MS: i64 = 1_795_946_400_000; // 10:00:00, a minute boundary
const NOW_MS: i64 = BASE_MS + 3_600_000;

fn order(partition: i32, offset: i64, at: &str) -> SourceRecord {
    SourceRecord {
        topic: "orders".into(),
        partition,
        offset,
        timestamp_ms: BASE_MS,
        key: Some(format!("o-{partition}-{offset}").into_bytes()),
        value: Some(
            format!(
                r#"{{"order_id":"o-{partition}-{offset}","amount":"1.00","currency":"EUR","country":"DE","status":"paid","created_at":"{at}"}}"#
            )
            .into_bytes(),
        ),
        raw_value_field: None,
    }
}

/// `10:MM:SS` of the test's day.
fn at(minutes: i64, seconds: i64) -> String {
    streamtable::clock::rfc3339_ms(BASE_MS + minutes * 60_000 + seconds * 1000)
}

async fn windows(h: &Harness) -> Vec<(String, i64)> {
    super::window_counts(h, "orders_per_minute", "orders").await
}

fn setup(h: &mut Harness) -> std::sync::Arc<ManualClock> {
    h.spec = super::shipped_spec();
    h.spec.retain_tables(|t| t.name == "orders");
    let clock = ManualClock::new(NOW_MS);
    h.backend.clock = clock.clone();
    clock
}

pub async fn a_record_from_year_9999_does_not_move_the_watermark(mut h: Harness) {
    setup(&mut h);
    // The producer's clock can be as wrong as the event time: offset 3 carries 9999 as its
    // Kafka timestamp too (CreateTime); the bound is then the time it is ingested.
    let mut both = order(0, 3, "9999-01-01T00:00:00Z");
    both.timestamp_ms = 253_370_764_800_000;
    let batch = [
        order(0, 0, &at(0, 5)),
        order(0, 1, "9999-01-01T00:00:00Z"),
        order(0, 2, &at(0, 10)),
        both,
    ];
    h.ingestor().handle(&event(&batch)).await.expect("ingest");
    // 10:02 moves the watermark to 10:01:30: window 10:00 closes with its two orders.
    h.ingestor()
        .handle(&event(&[order(0, 4, &at(2, 0))]))
        .await
        .expect("ingest");
    let dead = h.dead_letters().await;
    let kinds = super::kinds(&dead);
    assert_eq!(kinds.get("late"), None, "{dead:?}");
    // One per record and stateful table (orders_clean's dedup, orders_per_minute's window).
    assert_eq!(kinds.get("future"), Some(&4), "{dead:?}");
    assert!(
        dead.iter().all(|d| (d.offset == 1 || d.offset == 3)
            && d.message.contains("ahead of the record's Kafka timestamp")),
        "{dead:?}"
    );
    streamtable::scheduled::run(&h.backend, &h.tables(), &Default::default())
        .await
        .expect("scheduled run");
    assert_eq!(windows(&h).await, vec![("10:00".to_string(), 2)]);
    // The record is in the topic's own table.
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, 5);
}

pub async fn an_idle_partition_moves_to_the_lowest_active_watermark(mut h: Harness) {
    let clock = setup(&mut h);
    // Partition 2 opens window 10:00, then goes quiet.
    h.ingestor()
        .handle(&event(&[order(2, 0, &at(0, 5))]))
        .await
        .expect("ingest");
    clock.advance(6 * 60_000);
    // Partition 0 is far ahead (10:20), partition 1 at 10:00:40 (watermark 10:00:10); both
    // still receive.
    h.ingestor()
        .handle(&event(&[order(0, 0, &at(20, 0)), order(1, 0, &at(0, 40))]))
        .await
        .expect("ingest");
    let run = |h: &Harness| {
        let (backend, tables) = (h.backend.clone(), h.tables());
        async move {
            streamtable::scheduled::run(&backend, &tables, &Default::default())
                .await
                .expect("scheduled run")
        }
    };
    let report = run(&h).await;
    // Partition 2 moved to 10:00:10 (partition 1's watermark), which closes nothing; at
    // partition 0's 10:19:30 it would have closed 10:00 without partition 1's share.
    assert_eq!(report.idle.partitions, 0, "{:?}", report.idle);
    assert_eq!(windows(&h).await, vec![]);
    // Partition 1 reaches 10:02 (watermark 10:01:30, closing its own 10:00): partition 2
    // follows and closes its share of 10:00.
    h.ingestor()
        .handle(&event(&[order(1, 1, &at(2, 0))]))
        .await
        .expect("ingest");
    let report = run(&h).await;
    assert_eq!(report.idle.partitions, 1, "{:?}", report.idle);
    assert_eq!(windows(&h).await, vec![("10:00".to_string(), 2)]);
}

/// A record without a Kafka timestamp (a producer that sets none: Kafka's -1,
/// `NO_TIMESTAMP_TYPE`) is bounded by the time it is ingested, not by 1969: a good record is
/// not a `future` dead letter of every stateful table.
pub async fn a_record_without_a_kafka_timestamp_is_bounded_by_the_clock(mut h: Harness) {
    setup(&mut h);
    let mut none = order(0, 0, &at(0, 5));
    none.timestamp_ms = -1;
    let mut ahead = order(0, 1, "9999-01-01T00:00:00Z");
    ahead.timestamp_ms = -1;
    h.ingestor()
        .handle(&event(&[none, ahead]))
        .await
        .expect("ingest");
    let dead = h.dead_letters().await;
    // Only the year-9999 record is not believed (by each of the two stateful tables).
    assert!(
        dead.iter().all(|d| d.offset == 1),
        "a record without a timestamp was dead-lettered: {dead:?}"
    );
    assert_eq!(super::kinds(&dead).get("future"), Some(&2), "{dead:?}");
}
