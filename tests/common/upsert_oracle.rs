//! The oracle of upsert tables (both backends: `tests/embedded/upsert_property.rs`,
//! `tests/moto/upsert_property.rs`): for any history of deliveries (ingest crashing before or after
//! its checkpoint), re-delivered and zombie batches, commit rounds that crash before the swap or
//! lose its answer, compactions that apply the deletes, and processes that start cold (the key
//! index read from its runs), the table after every commit holds exactly the last record of
//! each key — a tombstone as no row — computed here from the records the checkpoints accepted,
//! by a model that knows nothing of indexes or delete files. Read after each commit by
//! `streamtable query`'s engine, pyiceberg and DuckDB, and Trino (Athena's engine) on moto.

use std::collections::BTreeMap;
use std::path::Path;

use super::Harness;
use super::event;
use super::faults::{Fault, FaultyPointers, FaultyState};
use proptest::prelude::*;
use serde_json::Value;
use streamtable::commit::commit_pending;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::generate::SourceRecord;
use streamtable::spec::PipelineSpec;

const PARTITIONS: i32 = 3;
/// Records per partition.
const TOTAL: i64 = 36;
/// Keys per partition (a key's records share its partition, as a producer keying by it sends them).
const KEYS: u64 = 4;
const TOPIC: &str = "order-status";
const TABLE: &str = "order_status";

const SPEC: &str = r#"
[[tables]]
name = "order_status"
topic = "order-status"
mode = "upsert"
primary_key = ["order_id"]
partition_by = ["day(updated_at)"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "status", type = "string" },
  { name = "updated_at", type = "timestamp", required = true },
]
"#;

fn mix(p: i32, o: i64) -> u64 {
    let mut x = (p as u64) << 32 ^ o as u64 ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The record at (partition, offset): always the same, whoever delivers it. `None` value: a
/// tombstone.
fn record(p: i32, o: i64) -> SourceRecord {
    let h = mix(p, o);
    let key = format!("o{}", p as u64 + PARTITIONS as u64 * (h % KEYS));
    // Event time over three days, so that a key's rows move between partitions of the table.
    let at = 1_795_946_400_000i64 + o * 2 * 3600 * 1000;
    let tombstone = (h >> 8).is_multiple_of(5);
    let status = ["placed", "paid", "shipped", "cancelled"][((h >> 16) % 4) as usize];
    let value = (!tombstone).then(|| {
        serde_json::json!({
            "order_id": key,
            "status": status,
            "updated_at": at,
        })
        .to_string()
        .into_bytes()
    });
    let key = if o % 2 == 0 {
        key.into_bytes()
    } else {
        serde_json::json!({ "order_id": key })
            .to_string()
            .into_bytes()
    };
    SourceRecord {
        topic: TOPIC.into(),
        partition: p,
        offset: o,
        timestamp_ms: at,
        key: Some(key),
        value,
        raw_value_field: None,
    }
}

#[derive(Debug, Clone)]
pub enum Step {
    /// Up to `len` records of each partition in `mask` from the ESM's position; `fault` 0
    /// crashes ingest before its checkpoint, 1 after it.
    Deliver { mask: u8, len: i64, fault: u8 },
    /// A zombie: `back` records behind the position, then new ones, for the partitions in `mask`.
    Zombie { mask: u8, back: i64, len: i64 },
    /// A commit round; `fault` 0 crashes before every swap, 1 loses the first swap's answer.
    Commit { fault: u8 },
    /// Compaction (applies the deletes).
    Compact,
    /// The next commit starts cold: its key index read from the runs the snapshot names.
    Cold,
}

pub fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u8..8, 1i64..14, 0u8..5).prop_map(|(mask, len, fault)| Step::Deliver { mask, len, fault }),
        1 => (1u8..8, 1i64..20, 1i64..10).prop_map(|(mask, back, len)| Step::Zombie { mask, back, len }),
        3 => (0u8..5).prop_map(|fault| Step::Commit { fault }),
        1 => Just(Step::Compact),
        1 => Just(Step::Cold),
    ]
}

fn chosen(mask: u8) -> impl Iterator<Item = i32> {
    (0..PARTITIONS).filter(move |p| mask & (1 << p) != 0)
}

/// What the table must hold once everything the checkpoints accepted is committed: per key,
/// its last record's (partition, offset), unless that record is a tombstone. Sorted.
fn expected(accepted: &[i64]) -> Vec<(String, i32, i64)> {
    let mut last: BTreeMap<String, (i32, i64, bool)> = BTreeMap::new();
    for p in 0..PARTITIONS {
        for o in 0..accepted[p as usize] {
            let r = record(p, o);
            let value: Option<Value> = r
                .value
                .as_deref()
                .map(|v| serde_json::from_slice(v).expect("value"));
            let key = match &value {
                Some(v) => v["order_id"].as_str().expect("key").to_string(),
                None => {
                    let text = String::from_utf8(r.key.clone().expect("key")).expect("utf8");
                    serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["order_id"].as_str().map(str::to_string))
                        .unwrap_or(text)
                }
            };
            last.insert(key, (p, o, value.is_none()));
        }
    }
    let mut rows: Vec<(String, i32, i64)> = last
        .into_iter()
        .filter(|(_, (_, _, gone))| !gone)
        .map(|(k, (p, o, _))| (k, p, o))
        .collect();
    rows.sort();
    rows
}

async fn table_rows(h: &Harness) -> Vec<(String, i32, i64)> {
    let mut rows: Vec<(String, i32, i64)> = super::query_rows(
        h,
        "SELECT order_id, kafka_partition, kafka_offset FROM order_status",
    )
    .await
    .into_iter()
    .map(|r| {
        let v = |i: usize| r[i].clone().expect("not null");
        (
            v(0),
            v(1).parse().expect("partition"),
            v(2).parse().expect("offset"),
        )
    })
    .collect();
    rows.sort();
    rows
}

async fn accepted(h: &Harness) -> Vec<i64> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        out.push(h.next_offset(TOPIC, p).await);
    }
    out
}

/// Runs `steps` on `h` (a fresh harness), checking the table after every commit and at the end.
pub async fn run(mut h: Harness, steps: Vec<Step>) {
    h.spec = PipelineSpec::parse(
        SPEC,
        Path::new("upsert.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec");
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    let compact = CompactOptions {
        min_input_files: 2,
        ..CompactOptions::default()
    };
    // The ESM's committed position per partition.
    let mut position = [0i64; PARTITIONS as usize];
    let deliver = |mask: u8, range: &dyn Fn(i32) -> (i64, i64)| {
        let mut recs = Vec::new();
        let mut ends = Vec::new();
        for p in chosen(mask) {
            let (start, end) = range(p);
            if start < end {
                recs.extend((start..end).map(|o| record(p, o)));
                ends.push((p, end));
            }
        }
        (recs, ends)
    };
    let mut committed_once = false;
    for s in steps.into_iter().chain([Step::Commit { fault: 9 }]) {
        match s {
            Step::Deliver { mask, len, fault } => {
                let (recs, ends) = deliver(mask, &|p| {
                    let c = position[p as usize];
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
                        position[p as usize] = end;
                    }
                }
            }
            Step::Zombie { mask, back, len } => {
                let (recs, ends) = deliver(mask, &|p| {
                    let start = (position[p as usize] - back).max(0);
                    (start, (start + back + len).min(TOTAL))
                });
                if recs.is_empty() {
                    continue;
                }
                h.ingestor()
                    .handle(&event(&recs))
                    .await
                    .expect("zombie batch");
                for (p, end) in ends {
                    let c = &mut position[p as usize];
                    *c = (*c).max(end);
                }
            }
            Step::Commit { fault } => {
                let backend = match fault {
                    0 => FaultyPointers::new(
                        h.backend.catalog.pointers().clone(),
                        (0..1000).collect(),
                        vec![],
                    )
                    .backend(&h.backend),
                    1 => FaultyPointers::new(h.backend.catalog.pointers().clone(), vec![], vec![0])
                        .backend(&h.backend),
                    _ => h.backend.clone(),
                };
                let done = commit_pending(&backend, &tables).await;
                if fault == 0 {
                    if let Ok(d) = done {
                        assert_eq!(d.batches, 0, "every swap failed, yet a round committed");
                    }
                    continue;
                }
                let done = match done {
                    Ok(d) => d,
                    // A lost answer may stop the round; the next one finds what landed.
                    Err(e) if fault == 1 => {
                        eprintln!("round with a lost answer stopped: {e}");
                        commit_pending(&h.backend, &tables).await.expect("resume")
                    }
                    Err(e) => panic!("commit: {e}"),
                };
                assert!(done.audit.ok(), "the round's audit: {:?}", done.audit);
                committed_once = true;
                let want = expected(&accepted(&h).await);
                assert_eq!(table_rows(&h).await, want, "after a commit");
                every_reader_agrees(&h, &want);
            }
            Step::Compact => {
                if !committed_once {
                    continue;
                }
                compact_all(&h.backend, &tables, &compact)
                    .await
                    .expect("compact");
                let (table, _) = h
                    .backend
                    .catalog
                    .load(&tables.ident(TABLE))
                    .await
                    .expect("load")
                    .expect("table");
                let deletes = table.metadata().current_snapshot().and_then(|s| {
                    s.summary()
                        .additional_properties
                        .get("total-delete-files")
                        .cloned()
                });
                assert!(
                    matches!(deletes.as_deref(), None | Some("0")),
                    "compaction applied every delete file: {deletes:?} left"
                );
            }
            Step::Cold => super::forget_warm_index(&h, TABLE).await,
        }
    }
    // Everything accepted is committed: the table is the last state of each key, for every reader.
    let want = expected(&accepted(&h).await);
    assert_eq!(table_rows(&h).await, want, "at the end");
    every_reader_agrees(&h, &want);
}

/// pyiceberg and DuckDB read the rows `want` (key, partition, offset) with the deletes applied,
/// and so does Trino where it runs (on moto).
fn every_reader_agrees(h: &Harness, want: &[(String, i32, i64)]) {
    let as_pairs: Vec<Value> = {
        let mut pairs: Vec<(i32, i64)> = want.iter().map(|(_, p, o)| (*p, *o)).collect();
        pairs.sort();
        pairs
            .into_iter()
            .map(|(p, o)| serde_json::json!([p, o]))
            .collect()
    };
    super::table_scenarios::check_table(h, TABLE, &as_pairs);
    h.assert_trino_reads_as_pyiceberg(TABLE, None);
}
