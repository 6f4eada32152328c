//! Exactly-once scenarios, run on every backend.

use std::collections::BTreeMap;

use streamtable::generate::SourceRecord;

use super::faults::{Fault, FaultyState};
use super::{Harness, event, keys, kinds, records};

pub async fn redelivered_batch_lands_once(h: &Harness) {
    let ing = h.ingestor();
    let ev = event(&records("orders", 0, 0..40));
    let first = ing.handle(&ev).await.expect("first delivery");
    assert_eq!((first.accepted, first.already_seen), (40, 0));
    let again = ing.handle(&ev).await.expect("re-delivery");
    assert_eq!(
        (again.accepted, again.already_seen, again.files_written),
        (0, 40, 0)
    );
    assert_eq!(h.landed("orders").await, keys(0, 0..40));
    assert_eq!(h.next_offset("orders", 0).await, 40);
    assert_eq!(h.backend.state.pending().await.expect("pending").len(), 1);
}

pub async fn retry_overlapping_accepted_offsets_takes_only_new_ones(h: &Harness) {
    let ing = h.ingestor();
    ing.handle(&event(&records("orders", 0, 0..100)))
        .await
        .expect("first");
    let s = ing
        .handle(&event(&records("orders", 0, 50..150)))
        .await
        .expect("overlap");
    assert_eq!((s.accepted, s.already_seen), (50, 50));
    assert_eq!(h.landed("orders").await, keys(0, 0..150));
    assert_eq!(h.next_offset("orders", 0).await, 150);
}

pub async fn gaps_in_offsets_are_normal(h: &Harness) {
    let ing = h.ingestor();
    let offsets = [0, 1, 5, 6, 40, 41, 1000];
    ing.handle(&event(&records("orders", 0, offsets)))
        .await
        .expect("gappy batch");
    assert_eq!(h.landed("orders").await, keys(0, offsets));
    assert_eq!(h.next_offset("orders", 0).await, 1001);
}

pub async fn crash_after_files_before_transaction_is_recovered_by_the_retry(h: &Harness) {
    let ev = event(&records("orders", 0, 0..30));
    let crashing = h.ingestor_with_state(FaultyState::new(
        h.backend.state.clone(),
        vec![Fault::CrashBeforeAdvance],
    ));
    let err = crashing.handle(&ev).await.expect_err("injected crash");
    assert!(
        err.is_retryable(),
        "a crash must be retried by the ESM: {err}"
    );
    assert_eq!(h.next_offset("orders", 0).await, 0, "nothing committed");
    assert!(h.backend.state.pending().await.expect("pending").is_empty());
    let table_dir = h
        .backend
        .warehouse
        .table_location(&h.backend.namespace, "orders");
    let orphans = h.backend.warehouse.list(&table_dir).await.expect("list");
    assert!(
        !orphans.is_empty(),
        "the crashed attempt had written its files"
    );

    let retry = h.ingestor().handle(&ev).await.expect("retry");
    assert_eq!(retry.accepted, 30);
    assert_eq!(h.landed("orders").await, keys(0, 0..30));
    assert_eq!(h.next_offset("orders", 0).await, 30);
}

pub async fn crash_after_transaction_before_response_is_not_repeated(h: &Harness) {
    let ev = event(&records("orders", 0, 0..30));
    let crashing = h.ingestor_with_state(FaultyState::new(
        h.backend.state.clone(),
        vec![Fault::CrashAfterAdvance],
    ));
    crashing.handle(&ev).await.expect_err("injected crash");
    let retry = h.ingestor().handle(&ev).await.expect("retry");
    assert_eq!((retry.accepted, retry.already_seen), (0, 30));
    assert_eq!(h.landed("orders").await, keys(0, 0..30));
    assert_eq!(h.backend.state.pending().await.expect("pending").len(), 1);
}

/// A slow (zombie) invocation of an older, smaller batch reads the checkpoint, then the ESM's
/// retry lands a larger batch; the zombie's conditional write must lose and change nothing.
pub async fn zombie_invocation_cannot_move_the_checkpoint_back(h: &Harness) {
    let live = h.ingestor();
    let live_event = event(&records("orders", 0, 0..100));
    let hook: super::faults::Fault = Fault::Before(Box::new(move || {
        Box::pin(async move {
            let s = live.handle(&live_event).await.expect("live invocation");
            assert_eq!(s.accepted, 100);
        })
    }));
    let zombie = h.ingestor_with_state(FaultyState::new(h.backend.state.clone(), vec![hook]));
    let s = zombie
        .handle(&event(&records("orders", 0, 0..50)))
        .await
        .expect("zombie returns");
    assert_eq!(s.conflicts, 1);
    assert_eq!((s.accepted, s.already_seen), (0, 50));
    assert_eq!(h.next_offset("orders", 0).await, 100);
    assert_eq!(h.landed("orders").await, keys(0, 0..100));
    assert_eq!(h.backend.state.pending().await.expect("pending").len(), 1);
}

/// Two invocations of the same batch at once: exactly one lands it.
pub async fn concurrent_duplicates_land_once(h: &Harness) {
    let ev = event(&records("payments", 2, 0..60));
    let (a, b) = (h.ingestor(), h.ingestor());
    let (ra, rb) = tokio::join!(a.handle(&ev), b.handle(&ev));
    let (ra, rb) = (ra.expect("a"), rb.expect("b"));
    assert_eq!(ra.accepted + rb.accepted, 60);
    assert_eq!(ra.already_seen + rb.already_seen, 60);
    assert_eq!(h.landed("payments").await, keys(2, 0..60));
}

pub async fn multi_partition_batches_checkpoint_each_partition(h: &Harness) {
    let mut recs = records("orders", 0, 0..20);
    recs.extend(records("orders", 1, 100..110));
    recs.extend(records("payments", 3, 5..12));
    recs.extend(records("readings", 0, 0..8));
    let s = h.ingestor().handle(&event(&recs)).await.expect("batch");
    assert_eq!((s.partitions, s.accepted, s.dead_lettered), (4, 45, 0));
    let mut expected = keys(0, 0..20);
    expected.extend(keys(1, 100..110));
    assert_eq!(h.landed("orders").await, expected);
    assert_eq!(h.landed("payments").await, keys(3, 5..12));
    assert_eq!(h.landed("readings").await, keys(0, 0..8));
    assert_eq!(h.next_offset("orders", 0).await, 20);
    assert_eq!(h.next_offset("orders", 1).await, 110);
    assert_eq!(h.next_offset("payments", 3).await, 12);
    // One file per table (all rows fall on one day), one pending batch for the invocation.
    assert_eq!(s.files_written, 3);
    let pending = h.backend.state.pending().await.expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].ranges().count(), 4);
}

/// A zombie whose batch overlaps the live batch on only some partitions: its conditional write
/// loses, it re-plans, lands only the partitions nobody landed, and moves no checkpoint back.
pub async fn zombie_overlapping_some_partitions_lands_only_the_rest(h: &Harness) {
    let live = h.ingestor();
    let mut live_recs = records("orders", 1, 0..40);
    live_recs.extend(records("orders", 2, 0..40));
    let live_event = event(&live_recs);
    let hook: super::faults::Fault = Fault::Before(Box::new(move || {
        Box::pin(async move {
            let s = live.handle(&live_event).await.expect("live invocation");
            assert_eq!(s.accepted, 80);
        })
    }));
    let zombie = h.ingestor_with_state(FaultyState::new(h.backend.state.clone(), vec![hook]));
    let mut zombie_recs = records("orders", 0, 0..30);
    zombie_recs.extend(records("orders", 1, 0..20));
    let s = zombie
        .handle(&event(&zombie_recs))
        .await
        .expect("zombie returns");
    assert_eq!(s.conflicts, 1);
    assert_eq!((s.accepted, s.already_seen), (30, 20));
    assert_eq!(h.next_offset("orders", 0).await, 30);
    assert_eq!(h.next_offset("orders", 1).await, 40);
    assert_eq!(h.next_offset("orders", 2).await, 40);
    let mut expected = keys(0, 0..30);
    expected.extend(keys(1, 0..40));
    expected.extend(keys(2, 0..40));
    assert_eq!(h.landed("orders").await, expected);
    assert_eq!(h.backend.state.pending().await.expect("pending").len(), 2);
}

/// A batch wider than one batch may be (here 40 partitions) is landed in groups, each its own
/// file set and transaction; a crash in the second group leaves the first landed, and the
/// retry lands the rest without repeating anything.
pub async fn wider_than_one_transaction_lands_in_groups(h: &Harness) {
    let width = 60;
    let recs: Vec<SourceRecord> = (0..width)
        .flat_map(|p| records("readings", p, 0..3))
        .collect();
    let ev = event(&recs);
    let narrow = |i: streamtable::ingest::Ingestor| {
        let o = streamtable::ingest::IngestOptions {
            max_partitions_per_batch: 40,
            ..i.options().clone()
        };
        i.with_options(o)
    };
    let crashing = narrow(h.ingestor_with_state(FaultyState::new(
        h.backend.state.clone(),
        vec![
            Fault::Before(Box::new(|| Box::pin(async {}))),
            Fault::CrashBeforeAdvance,
        ],
    )));
    assert!(
        crashing.handle(&ev).await.is_err(),
        "the second group failed"
    );
    assert_eq!(h.backend.state.pending().await.expect("pending").len(), 1);
    let s = narrow(h.ingestor()).handle(&ev).await.expect("retry");
    assert_eq!(s.accepted, 20 * 3);
    assert_eq!(s.already_seen, 40 * 3);
    let expected: Vec<(i32, i64)> = (0..width).flat_map(|p| keys(p, 0..3)).collect();
    assert_eq!(h.landed("readings").await, expected);
    for p in [0, 39, 40, width - 1] {
        assert_eq!(h.next_offset("readings", p).await, 3);
    }
    let pending = h.backend.state.pending().await.expect("pending");
    assert_eq!(pending.len(), 2);
    assert_eq!(
        pending.iter().map(|b| b.ranges().count()).sum::<usize>(),
        width as usize
    );
}

fn with_value(mut r: SourceRecord, value: Option<&[u8]>) -> SourceRecord {
    r.value = value.map(<[u8]>::to_vec);
    r
}

/// One record of every rejected kind, among good ones: each lands in `dead_letters` once, with
/// its raw bytes, kind and a message; the good ones land in the table.
pub async fn every_bad_record_kind_is_dead_lettered_once(h: &mut Harness) {
    h.spec.settings.max_record_bytes = 4096;
    let base = records("orders", 0, 0..20);
    let good_order = |o: i64| base[o as usize].clone();
    let mut recs: Vec<SourceRecord> = (0..20).map(good_order).collect();
    let cases: Vec<(usize, &str, Option<Vec<u8>>)> = vec![
        (1, "tombstone", None),
        (2, "empty_value", Some(vec![])),
        (
            3,
            "oversize",
            Some(format!("{{\"order_id\":\"{}\"}}", "x".repeat(5000)).into_bytes()),
        ),
        (4, "invalid_utf8", Some(vec![b'{', 0xff, 0xfe, b'}'])),
        (5, "not_json", Some(b"{\"order_id\": ".to_vec())),
        (6, "not_an_object", Some(b"[1,2]".to_vec())),
        (
            7,
            "wrong_type",
            Some(br#"{"order_id":"o","amount":true,"created_at":0}"#.to_vec()),
        ),
        (
            8,
            "missing_field",
            Some(br#"{"amount":"1.00","created_at":0}"#.to_vec()),
        ),
        (
            9,
            "invalid_timestamp",
            Some(br#"{"order_id":"o","amount":"1.00","created_at":"soon"}"#.to_vec()),
        ),
        (
            10,
            "out_of_range",
            Some(br#"{"order_id":"o","amount":"1.234","created_at":0}"#.to_vec()),
        ),
    ];
    for (i, _, v) in &cases {
        recs[*i] = with_value(recs[*i].clone(), v.as_deref());
    }
    recs[11].raw_value_field = Some("@@not-base64@@".into());
    let mut stranger = records("mystery", 0, 0..1).remove(0);
    stranger.value = Some(b"{\"anything\":1}".to_vec());
    recs.push(stranger);

    let s = h
        .ingestor()
        .handle(&event(&recs))
        .await
        .expect("batch with bad records");
    assert_eq!((s.accepted, s.dead_lettered), (9, 12));
    let good: Vec<i64> = (0..20).filter(|o| *o == 0 || *o > 11).collect();
    assert_eq!(h.landed("orders").await, keys(0, good));

    let dead = h.dead_letters().await;
    let expected_kinds: BTreeMap<String, usize> = [
        "tombstone",
        "empty_value",
        "oversize",
        "invalid_utf8",
        "not_json",
        "not_an_object",
        "wrong_type",
        "missing_field",
        "invalid_timestamp",
        "out_of_range",
        "invalid_base64",
        "unknown_topic",
    ]
    .into_iter()
    .map(|k| (k.to_string(), 1))
    .collect();
    assert_eq!(kinds(&dead), expected_kinds);
    for (i, kind, value) in &cases {
        let row = dead
            .iter()
            .find(|d| d.topic == "orders" && d.offset == *i as i64)
            .expect("dead letter row");
        assert_eq!(&row.kind, kind, "offset {i}");
        assert_eq!(&row.value, value, "raw bytes of offset {i} kept");
        assert!(!row.message.is_empty());
    }
    let b64 = dead
        .iter()
        .find(|d| d.offset == 11)
        .expect("invalid base64 row");
    assert_eq!(b64.value.as_deref(), Some(&b"@@not-base64@@"[..]));
    let unknown = dead
        .iter()
        .find(|d| d.topic == "mystery")
        .expect("unknown topic row");
    assert_eq!(unknown.value.as_deref(), Some(&b"{\"anything\":1}"[..]));
    assert!(
        unknown.message.contains("[[tables]]"),
        "{}",
        unknown.message
    );

    // Re-delivery adds nothing, to either table.
    let again = h
        .ingestor()
        .handle(&event(&recs))
        .await
        .expect("re-delivery");
    assert_eq!((again.accepted, again.dead_lettered), (0, 0));
    assert_eq!(h.dead_letters().await.len(), 12);
}

/// Rows carry their values exactly (decimals, timestamps, keys).
pub async fn values_land_exactly(h: &Harness) {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Decimal128Type, TimestampMicrosecondType};
    let mut r = records("orders", 0, 0..1).remove(0);
    // A millisecond an f64 round trip (ms / 1000.0, fraction * 1000, truncated) turns into .141.
    r.timestamp_ms = 1_795_946_400_142;
    r.value = Some(
        br#"{"order_id":"o-1","customer_id":"c","amount":"1234567890123456.78","currency":"EUR","created_at":"2026-11-29T11:00:00.000001+01:00","ignored":{"deep":[1]}}"#.to_vec(),
    );
    h.ingestor().handle(&event(&[r])).await.expect("one record");
    let batches = h.rows("orders").await;
    let b = &batches[0];
    let amount = b
        .column_by_name("amount")
        .expect("amount")
        .as_primitive::<Decimal128Type>();
    assert_eq!(amount.value(0), 123_456_789_012_345_678);
    let at = b
        .column_by_name("created_at")
        .expect("created_at")
        .as_primitive::<TimestampMicrosecondType>();
    assert_eq!(at.value(0), 1_795_946_400_000_001);
    let kafka_at = b
        .column_by_name("kafka_timestamp")
        .expect("kafka_timestamp")
        .as_primitive::<TimestampMicrosecondType>();
    assert_eq!(kafka_at.value(0), 1_795_946_400_142_000);
    let key = b
        .column_by_name("kafka_key")
        .expect("key")
        .as_string::<i32>();
    assert_eq!(key.value(0), "key-0");
    let status = b.column_by_name("status").expect("status");
    assert!(status.is_null(0));
}
