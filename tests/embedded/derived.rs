//! Derived tables on the embedded backend: the streamed result equals the batch result for any
//! history of deliveries, re-deliveries and crashes (see `common/derived_scenarios.rs`).

use crate::common::derived_scenarios::{step, streamed_equals_batch};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn derived_tables_equal_their_sql_run_as_a_batch_query(
        seed in any::<u64>(),
        steps in proptest::collection::vec(step(), 1..10),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async { streamed_equals_batch(common::embedded().await, seed, steps).await });
    }
}

use std::sync::Arc;

use crate::common;
use crate::common::{event, records};
use arrow_array::{ArrayRef, Decimal128Array, RecordBatch, StringArray};
use streamtable::clock::ManualClock;
use streamtable::query::{QueryEngine, TimeTravel};

fn rates(rows: &[(&str, i128)]) -> RecordBatch {
    let c: ArrayRef = Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0)));
    let r: ArrayRef = Arc::new(
        Decimal128Array::from_iter_values(rows.iter().map(|r| r.1))
            .with_precision_and_scale(18, 6)
            .expect("decimal"),
    );
    RecordBatch::try_from_iter([("currency", c), ("rate_to_eur", r)]).expect("rates")
}

async fn scalar(engine: &QueryEngine, sql: &str) -> String {
    let b = engine
        .query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    datafusion::arrow::util::pretty::pretty_format_batches(&b)
        .expect("format")
        .to_string()
        .lines()
        .nth(3)
        .unwrap_or_default()
        .trim_matches(|c| c == '|' || c == ' ')
        .to_string()
}

/// A reference table is read at the first batch and again once its refresh interval has
/// passed: rows landed before find no GBP rate, rows landed after find the one added.
#[tokio::test]
async fn reference_tables_are_re_read_after_their_refresh_interval() {
    let mut h = common::embedded().await;
    h.spec = common::shipped_spec();
    let clock = ManualClock::new(1_800_000_000_000);
    h.backend.clock = clock.clone();
    let tables = h.tables();
    let append = |rows: RecordBatch| {
        let (backend, tables) = (h.backend.clone(), tables.clone());
        async move {
            streamtable::references::append_rows(&backend, &tables, "currency_rates", &rows)
                .await
                .expect("append rates")
        }
    };
    append(rates(&[("USD", 500_000)])).await;
    let ingestor = h.ingestor();
    let usd = |range: std::ops::Range<i64>| {
        let mut recs = records("orders", 0, range);
        for r in &mut recs {
            r.value = Some(
                format!(
                    r#"{{"order_id":"o-{}","amount":"10.00","currency":"GBP","created_at":"2026-11-30T10:00:00Z"}}"#,
                    r.offset
                )
                .into_bytes(),
            );
        }
        recs
    };
    ingestor
        .handle(&event(&usd(0..3)))
        .await
        .expect("first batch");
    append(rates(&[("GBP", 2_000_000)])).await;
    // Within the interval: the copy already loaded.
    clock.advance(299_000);
    ingestor
        .handle(&event(&usd(3..5)))
        .await
        .expect("second batch");
    // Past it: the new snapshot.
    clock.advance(2_000);
    ingestor
        .handle(&event(&usd(5..8)))
        .await
        .expect("third batch");
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("engine");
    let unconverted = scalar(
        &engine,
        "SELECT count(*) FROM orders_clean WHERE amount_eur IS NULL",
    )
    .await;
    let converted = scalar(
        &engine,
        "SELECT count(*) FROM orders_clean WHERE amount_eur = 20.00",
    )
    .await;
    assert_eq!(
        (unconverted.as_str(), converted.as_str()),
        ("5", "3"),
        "no rate for the 5 orders before the refresh, the new one for the 3 after"
    );
}

/// `land = false`: a topic decoded only for its derived tables, with no table of its own.
#[tokio::test]
async fn a_topic_with_land_false_feeds_its_derived_tables_only() {
    let mut h = common::embedded().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let text = std::fs::read_to_string(&path).expect("spec").replace(
        "name = \"readings\"\ntopic = \"readings\"\n",
        "name = \"readings\"\ntopic = \"readings\"\nland = false\n",
    );
    h.spec = streamtable::spec::PipelineSpec::parse(&text, &path, &streamtable::process::Planner)
        .expect("spec with land = false");
    let tables = h.tables();
    assert!(!tables.tables.contains_key("readings"));
    assert!(tables.tables.contains_key("readings_alerts"));
    let mut recs = records("readings", 0, 0..20);
    for (i, r) in recs.iter_mut().enumerate() {
        r.value = Some(
            format!(
                r#"{{"sensor_id":"s","temperature":{}.5,"reported_at":"2026-11-30T10:00:00Z"}}"#,
                30 + i
            )
            .into_bytes(),
        );
    }
    let s = h.ingestor().handle(&event(&recs)).await.expect("ingest");
    assert_eq!(
        (s.accepted, s.files_written),
        (20, 1),
        "one file: readings_alerts"
    );
    assert_eq!(
        s.derived_rows, 15,
        "35.5 to 49.5: 15 readings at or above 35"
    );
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("engine");
    // 35.5 .. 49.5: 15 readings at or above 35.
    assert_eq!(
        scalar(&engine, "SELECT count(*) FROM readings_alerts").await,
        "15"
    );
    assert!(
        engine.query("SELECT count(*) FROM readings").await.is_err(),
        "no readings table"
    );

    // The batch given up on and replayed after later batches moved the checkpoint: its
    // records are found in the derived table (they duplicated into it when only the topic's
    // own table, which does not exist, was searched).
    let mut later = records("readings", 0, 20..25);
    for r in &mut later {
        r.value = Some(
            br#"{"sensor_id":"s","temperature":36.5,"reported_at":"2026-11-30T10:00:00Z"}"#
                .to_vec(),
        );
    }
    h.ingestor().handle(&event(&later)).await.expect("ingest");
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    // With a windowed table fed by the topic (sensor_sessions), which records landed cannot
    // be told: refused, naming the fix.
    let e = streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, &event(&recs))
        .await
        .expect_err("windows fed by a land = false topic");
    assert!(e.to_string().contains("set land = true"), "{e}");
    h.spec
        .derived
        .retain(|d| d.source != "readings" || d.table.name == "readings_alerts");
    let replayed = streamtable::replay::replay(&h.ingestor(), &h.backend, &h.spec, &event(&recs))
        .await
        .expect("replay");
    // 15 found; the 5 readings below 35 left no row anywhere, are landed again, and are
    // filtered out again.
    assert_eq!(replayed[0].already_landed, 15, "{replayed:?}");
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    let engine = QueryEngine::new(&h.backend, TimeTravel::Current)
        .await
        .expect("engine");
    assert_eq!(
        scalar(&engine, "SELECT count(*) FROM readings_alerts").await,
        "20",
        "15 + the 5 later ones, none twice"
    );
}

/// `streamtable check` exits 1 on a refused construct, naming file, line and construct, and
/// 0 with the plan on the shipped spec.
#[test]
fn check_exits_1_on_a_refused_construct() {
    let dir = tempfile::tempdir().expect("dir");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let bad = std::fs::read_to_string(&path).expect("spec").replace(
        "WHERE temperature >= 35",
        "WHERE temperature >= 35\nORDER BY reported_at",
    );
    let line = bad
        .lines()
        .position(|l| l.starts_with("ORDER BY"))
        .expect("the ORDER BY line")
        + 1;
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, bad).expect("write");
    let run = |spec: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_streamtable"))
            .args(["--home"])
            .arg(dir.path())
            .arg("--pipeline")
            .arg(spec)
            .arg("check")
            .env_remove("STREAMTABLE_BACKEND")
            .output()
            .expect("run streamtable check")
    };
    let out = run(&file);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("bad.toml:{line}:1: "))
            && err.contains("derived table \"readings_alerts\": ORDER BY cannot run on a stream"),
        "{err}"
    );
    let out = run(&path);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("table orders_clean <- SQL over orders"),
        "{text}"
    );
}
