//! The interval join against a brute-force oracle: orders and payments arrive through separate
//! deliveries (random widths per partition, crashes around the checkpoint write, re-deliveries)
//! and separate commit rounds (some crashing before the round's bookkeeping); then, for the
//! join `quick_payments` (payment within a minute after its order):
//!
//! - every joined row is a pair of the brute-force join over all input, and none is repeated;
//! - every pair of the brute-force join is joined, or one of its rows is a dead letter of kind
//!   `late` for the join;
//! - only rows generated late (by minutes) can be late: a row within the out-of-orderness of
//!   its partition is always joined, whatever the order of deliveries and commits.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use streamtable::generate::SourceRecord;
use streamtable::query::{QueryEngine, TimeTravel};

use super::faults::{Fault, FaultyState};
use super::{Harness, event};

const PARTITIONS: i32 = 2;
const TOTAL: i64 = 40;
const BASE_MS: i64 = 1_795_946_400_000;

/// A join over the shipped orders and payments, with a one-minute bound.
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

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// One generated row: id, the order it pays (payments), event time (ms), generated late.
struct Row {
    id: String,
    order: String,
    at_ms: i64,
    late: bool,
}

/// The row of `topic` at (`partition`, `offset`): event times advance 10 s per offset, out of
/// order by up to ±20 s (within the 30 s out-of-orderness), and one in 8 is 2 to 9 minutes
/// late. A payment pays an order of either partition from 3 offsets after to 12 before.
fn row(seed: u64, payments: bool, partition: i32, offset: i64) -> Row {
    let r = mix(seed ^ mix(((payments as u64) << 48) | ((partition as u64) << 32) | offset as u64));
    let mut at_ms = BASE_MS + offset * 10_000 + (r % 40_000) as i64 - 20_000;
    let late = (r >> 20).is_multiple_of(8);
    if late {
        at_ms -= 120_000 + ((r >> 30) % 420_000) as i64;
    }
    let d = ((r >> 40) % 16) as i64 - 3;
    let q = ((r >> 50) % PARTITIONS as u64) as i32;
    if payments {
        Row {
            id: format!("pay-{partition}-{offset}"),
            order: format!("o-{q}-{}", offset - d),
            at_ms,
            late,
        }
    } else {
        Row {
            id: format!("o-{partition}-{offset}"),
            order: String::new(),
            at_ms,
            late,
        }
    }
}

fn records(
    seed: u64,
    payments: bool,
    mask: u8,
    range: impl Fn(i32) -> (i64, i64),
) -> Vec<SourceRecord> {
    let topic = if payments { "payments" } else { "orders" };
    let mut out = Vec::new();
    for p in (0..PARTITIONS).filter(|p| mask & (1 << p) != 0) {
        let (start, end) = range(p);
        for offset in start..end {
            let r = row(seed, payments, p, offset);
            let at = streamtable::clock::rfc3339_ms(r.at_ms);
            let value = if payments {
                format!(
                    r#"{{"payment_id":"{}","order_id":"{}","amount":"10.00","method":"card","status":"ok","attempted_at":"{at}"}}"#,
                    r.id, r.order
                )
            } else {
                format!(
                    r#"{{"order_id":"{}","amount":"10.00","currency":"EUR","country":"DE","status":"paid","created_at":"{at}"}}"#,
                    r.id
                )
            };
            out.push(SourceRecord {
                topic: topic.into(),
                partition: p,
                offset,
                timestamp_ms: BASE_MS + offset * 1000,
                key: Some(r.id.into_bytes()),
                value: Some(value.into_bytes()),
                raw_value_field: None,
            });
        }
    }
    out
}

/// One step of the history.
#[derive(Debug, Clone)]
pub enum Step {
    /// `len` more records of each partition in `mask` of one topic; `fault` 0 crashes before
    /// the checkpoint write, 1 after it.
    Deliver {
        payments: bool,
        mask: u8,
        len: i64,
        fault: u8,
    },
    /// Records from `back` behind the committed position (a re-delivery, or a zombie).
    Redeliver {
        payments: bool,
        mask: u8,
        back: i64,
        len: i64,
    },
    /// A commit run; `crash` dies after the tables were committed, before the bookkeeping.
    Commit { crash: bool },
}

pub fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (any::<bool>(), 1u8..4, 1i64..15, 0u8..5)
            .prop_map(|(payments, mask, len, fault)| Step::Deliver { payments, mask, len, fault }),
        1 => (any::<bool>(), 1u8..4, 1i64..20, 1i64..15)
            .prop_map(|(payments, mask, back, len)| Step::Redeliver { payments, mask, back, len }),
        2 => any::<bool>().prop_map(|crash| Step::Commit { crash }),
    ];
    proptest::collection::vec(step, 1..14)
}

/// The brute-force join over all input: (order id, payment id) pairs.
fn oracle(seed: u64) -> BTreeSet<(String, String)> {
    let mut orders: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for p in 0..PARTITIONS {
        for o in 0..TOTAL {
            let r = row(seed, false, p, o);
            orders.entry(r.id).or_default().push(r.at_ms);
        }
    }
    let mut pairs = BTreeSet::new();
    for p in 0..PARTITIONS {
        for o in 0..TOTAL {
            let pay = row(seed, true, p, o);
            for created in orders.get(&pay.order).into_iter().flatten() {
                if (*created..=created + 60_000).contains(&pay.at_ms) {
                    pairs.insert((pay.order.clone(), pay.id.clone()));
                }
            }
        }
    }
    pairs
}

/// Runs the history on `h` and checks the property.
pub async fn join_equals_the_oracle(mut h: Harness, seed: u64, steps: Vec<Step>) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let text = std::fs::read_to_string(&path).expect("shipped spec") + JOIN;
    h.spec = streamtable::spec::PipelineSpec::parse(&text, &path, &streamtable::process::Planner)
        .expect("spec with the join");
    h.spec
        .retain_tables(|t| t.name == "orders" || t.name == "payments");
    h.spec.derived.retain(|d| d.join.is_some());
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    // The first commit sees every partition of both topics (see the last property).
    let mut committed: BTreeMap<(bool, i32), i64> = BTreeMap::new();
    let mut history = vec![
        Step::Deliver {
            payments: false,
            mask: 0b11,
            len: 1,
            fault: 9,
        },
        Step::Deliver {
            payments: true,
            mask: 0b11,
            len: 1,
            fault: 9,
        },
        Step::Commit { crash: false },
    ];
    history.extend(steps);
    for s in history {
        let (payments, recs, faults) = match s {
            Step::Commit { crash } => {
                let mut backend = h.backend.clone();
                if crash {
                    backend.state = FaultyState::new(
                        h.backend.state.clone(),
                        vec![Fault::CrashBeforeFinishCommit],
                    );
                }
                let _ = streamtable::commit::commit_pending(&backend, &tables).await;
                continue;
            }
            Step::Deliver {
                payments,
                mask,
                len,
                fault,
            } => {
                let recs = records(seed, payments, mask, |p| {
                    let c = committed.get(&(payments, p)).copied().unwrap_or(0);
                    (c, (c + len).min(TOTAL))
                });
                let faults = match fault {
                    0 => vec![Fault::CrashBeforeAdvance],
                    1 => vec![Fault::CrashAfterAdvance],
                    _ => vec![],
                };
                (payments, recs, faults)
            }
            Step::Redeliver {
                payments,
                mask,
                back,
                len,
            } => {
                let recs = records(seed, payments, mask, |p| {
                    let start = (committed.get(&(payments, p)).copied().unwrap_or(0) - back).max(0);
                    (start, (start + len).min(TOTAL))
                });
                (payments, recs, vec![])
            }
        };
        if recs.is_empty() {
            continue;
        }
        let ingestor = h.ingestor_with_state(FaultyState::new(h.backend.state.clone(), faults));
        if ingestor.handle(&event(&recs)).await.is_ok() {
            for r in &recs {
                let e = committed.entry((payments, r.partition)).or_insert(0);
                *e = (*e).max(r.offset + 1);
            }
        }
    }
    for payments in [false, true] {
        let rest = records(seed, payments, 0b11, |p| {
            (committed.get(&(payments, p)).copied().unwrap_or(0), TOTAL)
        });
        if !rest.is_empty() {
            h.ingestor()
                .handle(&event(&rest))
                .await
                .expect("final delivery");
        }
    }
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");

    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("query engine");
    let strings = |batches: Vec<arrow_array::RecordBatch>| -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for b in batches {
            let cols: Vec<arrow_array::ArrayRef> = b
                .columns()
                .iter()
                .map(|c| {
                    datafusion::arrow::compute::cast(
                        c,
                        &datafusion::arrow::datatypes::DataType::Utf8,
                    )
                    .expect("text")
                })
                .collect();
            for i in 0..b.num_rows() {
                out.push(
                    cols.iter()
                        .map(|c| {
                            let s: &arrow_array::StringArray =
                                c.as_any().downcast_ref().expect("string column");
                            s.value(i).to_string()
                        })
                        .collect(),
                );
            }
        }
        out
    };
    let joined = strings(
        engine
            .query("SELECT order_id, payment_id FROM quick_payments")
            .await
            .expect("joined rows"),
    );
    let late = strings(
        engine
            .query(
                "SELECT CAST(kafka_key AS VARCHAR) FROM dead_letters \
                 WHERE error_kind = 'late' AND error_message LIKE 'interval join quick_payments:%'",
            )
            .await
            .expect("late rows"),
    );
    let expected = oracle(seed);
    let joined_set: BTreeSet<(String, String)> = joined
        .iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    assert_eq!(joined_set.len(), joined.len(), "no pair is joined twice");
    assert!(
        joined_set.is_subset(&expected),
        "every joined row is a pair of the brute-force join: extra {:?}",
        joined_set.difference(&expected).collect::<Vec<_>>()
    );
    let late_ids: BTreeSet<String> = late.iter().map(|r| r[0].clone()).collect();
    assert_eq!(
        late_ids.len(),
        late.len(),
        "each late row is one dead letter"
    );
    for (order, payment) in expected.difference(&joined_set) {
        assert!(
            late_ids.contains(order) || late_ids.contains(payment),
            "pair ({order}, {payment}) is missing and neither row is a late dead letter"
        );
    }
    let generated_late: BTreeSet<String> = (0..PARTITIONS)
        .flat_map(|p| (0..TOTAL).flat_map(move |o| [(false, p, o), (true, p, o)]))
        .map(|(pay, p, o)| row(seed, pay, p, o))
        .filter(|r| r.late)
        .map(|r| r.id)
        .collect();
    assert!(
        late_ids.is_subset(&generated_late),
        "only rows generated minutes late can be late: {:?}",
        late_ids.difference(&generated_late).collect::<Vec<_>>()
    );
    assert!(!joined_set.is_empty(), "the history joins rows");
}
