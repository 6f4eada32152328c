//! Windows and dedup against a brute-force oracle: for any history of wide deliveries,
//! re-deliveries, zombies and crashes around the checkpoint write, with event times out of
//! order (within and beyond the out-of-orderness), late records and producer duplicates:
//!
//! - the view `orders_per_minute` holds, for every window a partition closed, exactly the count
//!   and sum of that partition's records which were not late — computed here from all input by
//!   simulating each partition's watermark — added up over partitions and corrections;
//! - every record later than the allowed lateness is one dead letter of kind `late`;
//! - the session windows of `country_sessions` (per country, 45 s gap, 1 min lateness) are
//!   exactly the sessions of each partition's on-time records that the final watermark closed,
//!   and each record behind the watermark minus the lateness is one dead letter of kind `late`;
//! - `country_orders` (tumbling minutes, `approx_distinct(order_id)`) holds for every closed
//!   window the estimate of the one sketch of all its on-time records' order ids, however many
//!   partitions and corrections contributed their own sketch (the union is exact), and that
//!   estimate is close to the exact count (producer copies count once);
//! - `orders_clean` (dedup by order_id) holds each order once, and every copy a producer re-sent
//!   is gone (the raw `orders` table keeps it).

use std::collections::{BTreeMap, BTreeSet};

use arrow_array::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use proptest::prelude::*;
use streamtable::generate::SourceRecord;
use streamtable::process::sketch::Sketch;
use streamtable::process::value::Value;
use streamtable::query::{QueryEngine, TimeTravel};

use super::derived_scenarios::{Step, step};
use super::faults::{Fault, FaultyState};
use super::{Harness, event};

const PARTITIONS: i32 = 3;
const TOTAL: i64 = 48;
const BASE_MS: i64 = 1_795_946_400_000;
const OUT_OF_ORDER_US: i64 = 30_000_000;
const LATENESS_US: i64 = 300_000_000;
const WINDOW_US: i64 = 60_000_000;
const GAP_US: i64 = 45_000_000;
const SESSION_LATENESS_US: i64 = 60_000_000;
/// Flink's time unit (1 ms): a window is final once the watermark reaches `end - 1 ms`.
const UNIT_US: i64 = 1_000;

/// A session window over orders, added to the shipped spec for this test.
const SESSIONS: &str = r#"
[[derived_tables]]
name = "country_sessions"
allowed_lateness = "1 minute"
sql = """
SELECT window_start AS session_start, window_end AS session_end, country,
       COUNT(*) AS orders, SUM(amount) AS revenue
FROM TABLE(SESSION(TABLE orders PARTITION BY country, DESCRIPTOR(created_at), INTERVAL '45' SECONDS))
GROUP BY window_start, window_end, country
"""

[[derived_tables]]
name = "country_orders"
allowed_lateness = "5 minutes"
sql = """
SELECT window_start, window_end, country, approx_distinct(order_id) AS orders
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, country
"""
"#;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The order at (`partition`, `offset`): every 6th is a producer's copy of the one before;
/// event times advance 10 s per offset, out of order by up to ±25 s, and one in 9 is 2 to 9
/// minutes late. A pure function of its coordinates and `seed`.
fn order(seed: u64, partition: i32, offset: i64) -> (String, i64) {
    let original = if offset % 6 == 5 { offset - 1 } else { offset };
    let r = mix(seed ^ mix(((partition as u64) << 32) | original as u64));
    let mut at = BASE_MS + original * 10_000 + (r % 50_000) as i64 - 25_000;
    if (r >> 20).is_multiple_of(9) {
        at -= 120_000 + ((r >> 30) % 420_000) as i64;
    }
    let country = ["DE", "FR", "US"][((r >> 8) % 3) as usize];
    let value = format!(
        r#"{{"order_id":"o-{partition}-{original}","amount":"{}.{:02}","currency":"EUR","country":"{country}","status":"paid","created_at":"{}"}}"#,
        (r >> 12) % 300,
        (r >> 40) % 100,
        streamtable::clock::rfc3339_ms(at)
    );
    (value, at * 1000)
}

fn records(seed: u64, mask: u8, range: impl Fn(i32) -> (i64, i64)) -> Vec<SourceRecord> {
    let mut out = Vec::new();
    for p in (0..PARTITIONS).filter(|p| mask & (1 << p) != 0) {
        let (start, end) = range(p);
        for offset in start..end {
            out.push(SourceRecord {
                topic: "orders".into(),
                partition: p,
                offset,
                timestamp_ms: BASE_MS + offset * 1000,
                key: Some(format!("o-{p}-{offset}").into_bytes()),
                value: Some(order(seed, p, offset).0.into_bytes()),
                raw_value_field: None,
            });
        }
    }
    out
}

fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let f: Vec<ArrayFormatter> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("formatter"))
            .collect();
        for i in 0..b.num_rows() {
            out.push(
                f.iter()
                    .map(|f| f.value(i).to_string())
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
    }
    out.sort();
    out
}

/// The oracle: per partition in offset order, the watermark before each record; records later
/// than the lateness are late, the others count in their window once the partition's final
/// watermark passed its end. Returns the expected view rows and the late (partition, offset)s,
/// for the tumbling windows and for the sessions, and the order ids of each closed window.
fn oracle(seed: u64) -> Oracle {
    let mut windows: BTreeMap<(i64, String), (i64, i128)> = BTreeMap::new();
    let mut ids: BTreeMap<(i64, String), BTreeSet<String>> = BTreeMap::new();
    let mut late = Vec::new();
    let mut sessions: BTreeMap<(i64, i64, String), (i64, i128)> = BTreeMap::new();
    let mut late_sessions = Vec::new();
    for p in 0..PARTITIONS {
        let events: Vec<(i64, i64, String, i128, String)> = (0..TOTAL)
            .map(|o| {
                let (value, t) = order(seed, p, o);
                let v: serde_json::Value = serde_json::from_str(&value).expect("json");
                let amount = v["amount"].as_str().expect("amount").replace('.', "");
                (
                    o,
                    t,
                    v["country"].as_str().expect("country").to_string(),
                    amount.parse().expect("cents"),
                    v["order_id"].as_str().expect("order_id").to_string(),
                )
            })
            .collect();
        let mut max: Option<i64> = None;
        let mut counted = Vec::new();
        let mut on_time: BTreeMap<String, Vec<(i64, i128)>> = BTreeMap::new();
        for (o, t, country, cents, id) in &events {
            let wm = max.map(|m| m - OUT_OF_ORDER_US);
            // Flink's rules: a window is final at its last millisecond (`end - 1 ms`); sessions
            // are emitted final, so a record that could touch an emitted one is late.
            if wm.is_some_and(|wm| *t <= wm - SESSION_LATENESS_US + UNIT_US) {
                late_sessions.push(format!("{p} | {o}"));
            } else {
                on_time
                    .entry(country.clone())
                    .or_default()
                    .push((*t, *cents));
            }
            let start = t - t.rem_euclid(WINDOW_US);
            if wm.is_some_and(|wm| start + WINDOW_US - UNIT_US + LATENESS_US <= wm) {
                late.push(format!("{p} | {o}"));
            } else {
                counted.push((start, country.clone(), *cents, id.clone()));
            }
            max = Some(max.map_or(*t, |m| m.max(*t)));
        }
        let final_wm = max.map_or(i64::MIN, |m| m - OUT_OF_ORDER_US);
        for (country, mut times) in on_time {
            times.sort();
            let mut current: Option<(i64, i64, i64, i128)> = None;
            let mut all = Vec::new();
            for (t, cents) in times {
                current = match current {
                    Some((s, e, n, c)) if t <= e => Some((s, e.max(t + GAP_US), n + 1, c + cents)),
                    other => {
                        all.extend(other);
                        Some((t, t + GAP_US, 1, cents))
                    }
                };
            }
            all.extend(current);
            for (s, e, n, c) in all {
                if e - UNIT_US + SESSION_LATENESS_US <= final_wm {
                    let entry = sessions.entry((s, e, country.clone())).or_default();
                    entry.0 += n;
                    entry.1 += c;
                }
            }
        }
        for (start, country, cents, id) in counted {
            if start + WINDOW_US - UNIT_US <= final_wm {
                ids.entry((start, country.clone())).or_default().insert(id);
                let e = windows.entry((start, country)).or_default();
                e.0 += 1;
                e.1 += cents;
            }
        }
    }
    let fmt = |us: i64| {
        chrono::DateTime::from_timestamp_micros(us)
            .expect("time")
            .format("%Y-%m-%dT%H:%M:%S%.f")
            .to_string()
    };
    let sessions = sessions
        .into_iter()
        .map(|((s, e, country), (n, cents))| {
            format!(
                "{} | {} | {country} | {n} | {}.{:02}",
                fmt(s),
                fmt(e),
                cents / 100,
                cents % 100
            )
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    late_sessions.sort();
    let expected = windows
        .into_iter()
        .map(|((start, country), (n, cents))| {
            format!(
                "{} | {} | {country} | {n} | {}.{:02}",
                fmt(start),
                fmt(start + WINDOW_US),
                cents / 100,
                cents % 100
            )
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    late.sort();
    let distinct = ids
        .into_iter()
        .map(|((start, country), ids)| {
            (
                format!("{} | {} | {country}", fmt(start), fmt(start + WINDOW_US)),
                ids,
            )
        })
        .collect();
    Oracle {
        expected,
        late,
        sessions,
        late_sessions,
        distinct,
    }
}

/// What the oracle expects.
struct Oracle {
    /// `orders_per_minute`'s rows.
    expected: Vec<String>,
    /// Its late (partition, offset)s.
    late: Vec<String>,
    /// `country_sessions`' rows and late records.
    sessions: Vec<String>,
    late_sessions: Vec<String>,
    /// For each closed minute and country ("start | end | country"), the distinct order ids
    /// counted in it.
    distinct: BTreeMap<String, BTreeSet<String>>,
}

pub fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(step(), 1..10)
}

/// Runs the history on `h` with the shipped spec and checks the property.
pub async fn windows_equal_the_oracle(mut h: Harness, seed: u64, steps: Vec<Step>) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let text = std::fs::read_to_string(&path).expect("shipped spec") + SESSIONS;
    h.spec = streamtable::spec::PipelineSpec::parse(&text, &path, &streamtable::process::Planner)
        .expect("spec with sessions");
    h.spec.retain_tables(|t| t.name == "orders");
    let tables = h.tables();
    let mut committed: BTreeMap<i32, i64> = BTreeMap::new();
    let warm = h.ingestor();
    let mut warm_turn = false;
    for s in steps {
        let (recs, faults) = match s {
            Step::Deliver { mask, len, fault } => {
                let recs = records(seed, mask, |p| {
                    let c = committed.get(&p).copied().unwrap_or(0);
                    (c, (c + len).min(TOTAL))
                });
                let faults = match fault {
                    0 => vec![Fault::CrashBeforeAdvance],
                    1 => vec![Fault::CrashAfterAdvance],
                    _ => vec![],
                };
                (recs, faults)
            }
            Step::Redeliver { mask, back, len } => {
                let recs = records(seed, mask, |p| {
                    let start = (committed.get(&p).copied().unwrap_or(0) - back).max(0);
                    (start, (start + len).min(TOTAL))
                });
                (recs, vec![])
            }
        };
        if recs.is_empty() {
            continue;
        }
        // Fault-free deliveries alternate between one long-lived ingestor (a warm container,
        // whose cached states others' advances make stale) and fresh ones.
        warm_turn = !warm_turn;
        let fresh;
        let ingestor = if faults.is_empty() && warm_turn {
            &warm
        } else {
            fresh = h.ingestor_with_state(FaultyState::new(h.backend.state.clone(), faults));
            &fresh
        };
        if ingestor.handle(&event(&recs)).await.is_ok() {
            for r in &recs {
                let e = committed.entry(r.partition).or_insert(0);
                *e = (*e).max(r.offset + 1);
            }
        }
    }
    let rest = records(seed, 0b111, |p| {
        (committed.get(&p).copied().unwrap_or(0), TOTAL)
    });
    if !rest.is_empty() {
        h.ingestor()
            .handle(&event(&rest))
            .await
            .expect("final delivery");
    }
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("query engine");
    let q = |sql: &'static str| {
        let engine = &engine;
        async move {
            rows(
                &engine
                    .query(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}")),
            )
        }
    };
    let Oracle {
        expected,
        late,
        sessions,
        late_sessions,
        distinct,
    } = oracle(seed);
    assert!(!expected.is_empty(), "the history closes windows");
    let streamed =
        q("SELECT window_start, window_end, country, orders, revenue FROM orders_per_minute").await;
    assert_eq!(
        streamed, expected,
        "every closed window: the exact count and sum of its on-time records"
    );
    let dead = q("SELECT kafka_partition, kafka_offset FROM dead_letters \
                  WHERE error_kind = 'late' AND error_message LIKE 'derived table orders_per_minute: %'")
        .await;
    let mut dead_sorted = dead.clone();
    dead_sorted.sort();
    let mut late_sorted = late.clone();
    late_sorted.sort();
    assert_eq!(
        dead_sorted, late_sorted,
        "every late record is one dead letter of kind late"
    );
    assert!(!sessions.is_empty(), "the history closes sessions");
    assert_eq!(
        q("SELECT session_start, session_end, country, orders, revenue FROM country_sessions")
            .await,
        sessions,
        "every closed session: exactly the on-time records less than the gap apart"
    );
    let mut dead = q("SELECT kafka_partition, kafka_offset FROM dead_letters \
                      WHERE error_kind = 'late' AND error_message LIKE 'derived table country_sessions: %'")
        .await;
    dead.sort();
    assert_eq!(
        dead, late_sessions,
        "every record behind the watermark minus the lateness is one late dead letter"
    );
    let estimates = q("SELECT window_start, window_end, country, orders FROM country_orders").await;
    let mut sketched = Vec::new();
    for (window, ids) in &distinct {
        let cells: Vec<Value> = ids.iter().map(|id| Value::Str(id.clone())).collect();
        let estimate = Sketch::of(&cells).estimate();
        let exact = ids.len() as i64;
        assert!(
            (estimate - exact).abs() <= 1 + exact / 10,
            "{window}: estimate {estimate} of {exact} distinct"
        );
        sketched.push(format!("{window} | {estimate}"));
    }
    sketched.sort();
    assert_eq!(
        estimates, sketched,
        "every closed window: the estimate of the union of its partial sketches is the estimate of one sketch over its on-time order ids"
    );
    assert_eq!(
        q("SELECT count(*) FROM orders").await,
        [(PARTITIONS as i64 * TOTAL).to_string()],
        "the raw table keeps every record, copies included"
    );
    let originals = PARTITIONS as i64 * (TOTAL - TOTAL / 6);
    assert_eq!(
        q("SELECT count(*), count(DISTINCT order_id) FROM orders_clean").await,
        [format!("{originals} | {originals}")],
        "orders_clean: each order once, the producer's copies dropped"
    );
}
