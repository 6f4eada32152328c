//! For any history of deliveries, re-deliveries, crashes before and after the checkpoint write,
//! and stale (zombie) batches, every accepted record lands exactly once and every rejected
//! record is dead-lettered exactly once. Embedded backend, real files, real SQLite.

mod common;

use std::collections::BTreeSet;

use common::faults::{Fault, FaultyState};
use common::{event, records};
use proptest::prelude::*;
use streamtable::generate::SourceRecord;

const TOTAL: i64 = 120;

/// Offsets that hold a bad record.
fn is_bad(offset: i64) -> bool {
    offset % 13 == 5
}

fn source(offsets: std::ops::Range<i64>) -> Vec<SourceRecord> {
    let mut recs = records("orders", 0, offsets);
    for r in &mut recs {
        if is_bad(r.offset) {
            r.value = Some(b"{\"order_id\": 42}".to_vec());
        }
    }
    recs
}

#[derive(Debug, Clone)]
enum Step {
    /// The ESM delivers `len` records from its committed position.
    Deliver { len: i64, fault: u8 },
    /// A stale batch from `back` records behind the committed position is delivered again.
    Stale { back: i64, len: i64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1i64..40, 0u8..4).prop_map(|(len, fault)| Step::Deliver { len, fault }),
        1 => (1i64..60, 1i64..40).prop_map(|(back, len)| Step::Stale { back, len }),
    ]
}

async fn run(steps: Vec<Step>) {
    let h = common::embedded().await;
    let mut committed = 0i64; // the ESM's committed Kafka offset
    for s in steps {
        match s {
            Step::Deliver { len, fault } => {
                let end = (committed + len).min(TOTAL);
                if committed >= end {
                    continue;
                }
                let ev = event(&source(committed..end));
                let faults = match fault {
                    0 => vec![Fault::CrashBeforeAdvance],
                    1 => vec![Fault::CrashAfterAdvance],
                    _ => vec![],
                };
                let ing = h.ingestor_with_state(FaultyState::new(h.backend.state.clone(), faults));
                if ing.handle(&ev).await.is_ok() {
                    committed = end;
                }
            }
            Step::Stale { back, len } => {
                let start = (committed - back).max(0);
                let end = (start + len).min(committed);
                if start < end {
                    h.ingestor()
                        .handle(&event(&source(start..end)))
                        .await
                        .expect("stale batch");
                }
            }
        }
    }
    // The ESM keeps delivering until everything is committed.
    while committed < TOTAL {
        let end = (committed + 50).min(TOTAL);
        h.ingestor()
            .handle(&event(&source(committed..end)))
            .await
            .expect("final delivery");
        committed = end;
    }

    let good: Vec<(i32, i64)> = (0..TOTAL).filter(|o| !is_bad(*o)).map(|o| (0, o)).collect();
    assert_eq!(
        h.landed("orders").await,
        good,
        "each accepted record exactly once"
    );
    let dead: Vec<i64> = h.dead_letters().await.iter().map(|d| d.offset).collect();
    let expected: Vec<i64> = (0..TOTAL).filter(|o| is_bad(*o)).collect();
    assert_eq!(
        dead, expected,
        "each rejected record dead-lettered exactly once"
    );
    assert_eq!(h.next_offset("orders", 0).await, TOTAL);
    let batches = h.backend.state.pending().await.expect("pending");
    let firsts: BTreeSet<i64> = batches.iter().map(|b| b.first_offset).collect();
    assert_eq!(firsts.len(), batches.len(), "no batch recorded twice");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn any_delivery_history_lands_each_record_exactly_once(steps in proptest::collection::vec(step(), 1..12)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(run(steps));
    }
}
