//! For any history of wide deliveries (several partitions per invocation), re-deliveries,
//! crashes before and after the checkpoint write, zombie batches that overlap only some of the
//! partitions, and duplicate invocations racing each other, every accepted record lands exactly
//! once and every rejected record is dead-lettered exactly once. Embedded backend, real files,
//! real SQLite.

use std::collections::BTreeSet;

use crate::common;
use crate::common::faults::{Fault, FaultyState};
use crate::common::{event, records};
use proptest::prelude::*;
use streamtable::generate::SourceRecord;

/// Partitions of the topic; a delivery takes any non-empty subset of them.
const PARTITIONS: i32 = 4;
/// Records per partition.
const TOTAL: i64 = 60;

/// Offsets that hold a bad record.
fn is_bad(partition: i32, offset: i64) -> bool {
    (offset + partition as i64) % 13 == 5
}

fn chosen(mask: u8) -> impl Iterator<Item = i32> {
    (0..PARTITIONS).filter(move |p| mask & (1 << p) != 0)
}

/// The records of `partition` in `offsets`, bad ones included.
fn source(partition: i32, offsets: std::ops::Range<i64>) -> Vec<SourceRecord> {
    let mut recs = records("orders", partition, offsets);
    for r in &mut recs {
        if is_bad(partition, r.offset) {
            r.value = Some(b"{\"order_id\": 42}".to_vec());
        }
    }
    recs
}

#[derive(Debug, Clone)]
enum Step {
    /// The ESM delivers up to `len` records of each partition in `mask` from its committed
    /// position, in one invocation.
    Deliver { mask: u8, len: i64, fault: u8 },
    /// A zombie: for the partitions in `stale`, a batch starting `back` records behind the
    /// committed position; for the others in `mask`, new records. One invocation.
    Zombie {
        mask: u8,
        stale: u8,
        back: i64,
        len: i64,
    },
    /// Two invocations with overlapping partitions and offsets run at the same time.
    Race { a: u8, b: u8, len: i64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u8..16, 1i64..30, 0u8..4).prop_map(|(mask, len, fault)| Step::Deliver { mask, len, fault }),
        2 => (1u8..16, 0u8..16, 1i64..40, 1i64..30)
            .prop_map(|(mask, stale, back, len)| Step::Zombie { mask, stale, back, len }),
        1 => (1u8..16, 1u8..16, 1i64..30).prop_map(|(a, b, len)| Step::Race { a, b, len }),
    ]
}

/// The records of one invocation, `range(partition)` for each partition in `mask`.
fn batch(mask: u8, range: impl Fn(i32) -> (i64, i64)) -> (Vec<SourceRecord>, Vec<(i32, i64)>) {
    let mut recs = Vec::new();
    let mut ends = Vec::new();
    for p in chosen(mask) {
        let (start, end) = range(p);
        if start < end {
            recs.extend(source(p, start..end));
            ends.push((p, end));
        }
    }
    (recs, ends)
}

async fn run(steps: Vec<Step>) {
    let h = common::embedded().await;
    // The ESM's committed Kafka offset per partition.
    let mut committed = [0i64; PARTITIONS as usize];
    for s in steps {
        match s {
            Step::Deliver { mask, len, fault } => {
                let (recs, ends) = batch(mask, |p| {
                    let c = committed[p as usize];
                    (c, (c + len).min(TOTAL))
                });
                if recs.is_empty() {
                    continue;
                }
                let faults = match fault {
                    0 => vec![Fault::CrashBeforeAdvance],
                    1 => vec![Fault::CrashAfterAdvance],
                    _ => vec![],
                };
                let ing = h.ingestor_with_state(FaultyState::new(h.backend.state.clone(), faults));
                if ing.handle(&event(&recs)).await.is_ok() {
                    for (p, end) in ends {
                        committed[p as usize] = end;
                    }
                }
            }
            Step::Zombie {
                mask,
                stale,
                back,
                len,
            } => {
                let (recs, ends) = batch(mask, |p| {
                    let c = committed[p as usize];
                    let start = if stale & (1 << p) != 0 {
                        (c - back).max(0)
                    } else {
                        c
                    };
                    (start, (start + len).min(TOTAL))
                });
                if recs.is_empty() {
                    continue;
                }
                h.ingestor()
                    .handle(&event(&recs))
                    .await
                    .expect("zombie batch");
                for (p, end) in ends {
                    let c = &mut committed[p as usize];
                    *c = (*c).max(end);
                }
            }
            Step::Race { a, b, len } => {
                let range = |p: i32| {
                    let c = committed[p as usize];
                    (c, (c + len).min(TOTAL))
                };
                let (recs_a, ends_a) = batch(a, range);
                let (recs_b, ends_b) = batch(b, range);
                let (ing_a, ing_b) = (h.ingestor(), h.ingestor());
                let (ev_a, ev_b) = (event(&recs_a), event(&recs_b));
                let (ra, rb) = tokio::join!(ing_a.handle(&ev_a), ing_b.handle(&ev_b));
                ra.expect("first racer");
                rb.expect("second racer");
                for (p, end) in ends_a.into_iter().chain(ends_b) {
                    let c = &mut committed[p as usize];
                    *c = (*c).max(end);
                }
            }
        }
    }
    // The ESM keeps delivering all partitions until everything is committed.
    while committed.iter().any(|c| *c < TOTAL) {
        let (recs, ends) = batch(0b1111, |p| {
            let c = committed[p as usize];
            (c, (c + 25).min(TOTAL))
        });
        h.ingestor()
            .handle(&event(&recs))
            .await
            .expect("final delivery");
        for (p, end) in ends {
            committed[p as usize] = end;
        }
    }

    let all = || (0..PARTITIONS).flat_map(|p| (0..TOTAL).map(move |o| (p, o)));
    let good: Vec<(i32, i64)> = all().filter(|(p, o)| !is_bad(*p, *o)).collect();
    assert_eq!(
        h.landed("orders").await,
        good,
        "each accepted record exactly once"
    );
    let mut dead: Vec<(i32, i64)> = h
        .dead_letters()
        .await
        .iter()
        .map(|d| (d.partition, d.offset))
        .collect();
    dead.sort();
    let expected: Vec<(i32, i64)> = all().filter(|(p, o)| is_bad(*p, *o)).collect();
    assert_eq!(
        dead, expected,
        "each rejected record dead-lettered exactly once"
    );
    for p in 0..PARTITIONS {
        assert_eq!(h.next_offset("orders", p).await, TOTAL, "checkpoint of {p}");
    }
    // No offset is claimed by two pending batches.
    let batches = h.backend.state.pending().await.expect("pending");
    let mut claimed = BTreeSet::new();
    for b in &batches {
        for r in b.ranges() {
            for o in r.first_offset..=r.last_offset {
                assert!(
                    claimed.insert((r.source.partition, o)),
                    "offset {o} of partition {} in two pending batches",
                    r.source.partition
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn any_delivery_history_lands_each_record_exactly_once(steps in proptest::collection::vec(step(), 1..12)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(run(steps));
    }
}
