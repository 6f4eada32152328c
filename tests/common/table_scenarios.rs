//! Commit, compaction and maintenance scenarios, checked from outside through pyiceberg and
//! DuckDB, run on every backend.

use std::collections::BTreeSet;

use serde_json::Value;
use streamtable::backend::Backend;
use streamtable::commit::commit_pending;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::generate::SourceRecord;
use streamtable::maintenance::maintain_all;
use streamtable::scheduled;

use super::faults::{Fault, FaultyPointers, FaultyState};
use super::{Harness, event, records};

/// Keys as the readers print them: `[partition, offset]`.
pub fn json_keys(partition: i32, offsets: impl IntoIterator<Item = i64>) -> Vec<Value> {
    offsets
        .into_iter()
        .map(|o| serde_json::json!([partition, o]))
        .collect()
}

pub fn keys(v: &Value) -> Vec<Value> {
    v["keys"].as_array().expect("keys").clone()
}

pub fn operations(v: &Value) -> Vec<String> {
    v["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| s["operation"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Both outside readers agree with each other and return `expected` keys; returns pyiceberg's view.
pub fn check_table(h: &Harness, table: &str, expected: &[Value]) -> Value {
    let py = h.read_external("pyiceberg", table);
    let duck = h.read_external("duckdb", table);
    assert_eq!(keys(&py), expected, "pyiceberg rows of {table}");
    assert_eq!(keys(&duck), expected, "DuckDB rows of {table}");
    assert_eq!(
        py["checksum"], duck["checksum"],
        "pyiceberg and DuckDB see the same values in {table}"
    );
    assert_eq!(py["format_version"], 2);
    py
}

pub fn opts() -> CompactOptions {
    CompactOptions::default()
}

pub fn sched() -> streamtable::scheduled::ScheduledOptions {
    streamtable::scheduled::ScheduledOptions::default()
}

fn mixed_batch() -> Vec<SourceRecord> {
    let mut recs = records("orders", 0, 0..30);
    recs.extend(records("orders", 1, 0..20));
    recs.extend(records("payments", 0, 0..25));
    recs.extend(records("readings", 2, 0..15));
    recs[3].value = Some(b"not json".to_vec());
    recs
}

pub async fn committed_tables_read_back_through_pyiceberg_and_duckdb(h: &Harness) {
    h.ingestor()
        .handle(&event(&mixed_batch()))
        .await
        .expect("ingest");
    let report = scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("scheduled run");
    // One batch for the whole invocation: four partitions, one pending item.
    assert_eq!(report.commit.batches, 1);
    assert_eq!(report.commit.rows(), 90);

    let mut orders: Vec<Value> = json_keys(0, (0..30).filter(|o| *o != 3));
    orders.extend(json_keys(1, 0..20));
    let py = check_table(h, "orders", &orders);
    assert_eq!(operations(&py), ["append"]);
    let summary = &py["snapshots"][0]["summary"];
    assert!(
        summary["streamtable.commit-id"]
            .as_str()
            .is_some_and(|s| s.ends_with("/orders"))
    );
    assert_eq!(summary["streamtable.offset.orders-0"], "29");
    assert_eq!(summary["streamtable.offset.orders-1"], "19");
    assert_eq!(summary["total-records"], "49");
    check_table(h, "payments", &json_keys(0, 0..25));
    check_table(h, "readings", &json_keys(2, 0..15));
    let dead = check_table(h, "dead_letters", &[serde_json::json!(["orders", 0, 3])]);
    assert_eq!(dead["columns"][0], "topic");

    // A second run has nothing to do and adds no snapshot.
    let again = scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("second run");
    assert_eq!(again.commit.batches, 0);
    assert_eq!(
        operations(&h.read_external("pyiceberg", "orders")),
        ["append"]
    );
    assert!(h.backend.state.pending().await.expect("pending").is_empty());
}

/// Every table is created on first use, empty tables included, with the spec's layout.
pub async fn tables_are_created_on_first_use(h: &Harness) {
    scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("scheduled run");
    for t in ["orders", "payments", "readings", "dead_letters"] {
        let py = h.read_external("pyiceberg", t);
        assert_eq!(py["count"], 0, "{t} starts empty");
    }
    let py = h.read_external("pyiceberg", "orders");
    let cols: Vec<&str> = py["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        cols,
        [
            "order_id",
            "customer_id",
            "amount",
            "currency",
            "country",
            "status",
            "created_at",
            "kafka_partition",
            "kafka_offset",
            "kafka_timestamp",
            "kafka_key",
            "kafka_key_bytes"
        ]
    );
}

/// A crash after every table was committed but before the bookkeeping: the next run finishes
/// the bookkeeping and appends nothing twice.
pub async fn commit_crash_before_bookkeeping_is_finished_without_duplicates(h: &Harness) {
    h.ingestor()
        .handle(&event(&mixed_batch()))
        .await
        .expect("ingest");
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    let faulty = Backend {
        state: FaultyState::new(
            h.backend.state.clone(),
            vec![Fault::CrashBeforeFinishCommit],
        ),
        ..h.backend.clone()
    };
    commit_pending(&faulty, &tables)
        .await
        .expect_err("injected crash");
    assert!(
        h.backend
            .state
            .commit_intent()
            .await
            .expect("intent")
            .is_some()
    );
    let resumed = commit_pending(&h.backend, &tables).await.expect("resume");
    assert_eq!(resumed.resumed, 1);
    assert!(
        resumed.tables.iter().all(|t| t.already_committed),
        "{resumed:?}"
    );
    assert!(
        h.backend
            .state
            .commit_intent()
            .await
            .expect("intent")
            .is_none()
    );
    assert!(h.backend.state.pending().await.expect("pending").is_empty());
    let py = check_table(h, "payments", &json_keys(0, 0..25));
    assert_eq!(operations(&py), ["append"]);
}

/// A crash in the middle of committing (first table committed, second not): the next run skips
/// the first by its commit id and commits the rest.
pub async fn commit_crash_between_tables_is_resumed(h: &Harness) {
    h.ingestor()
        .handle(&event(&mixed_batch()))
        .await
        .expect("ingest");
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    // With one unit at a time, tables commit in name order: dead_letters (swap 0), orders
    // (swap 1), payments, readings. The process dies at swap 1: every swap from then on fails
    // (an error alone would be an unknown outcome, checked and retried).
    let faulty = FaultyPointers::new(
        h.backend.catalog.pointers().clone(),
        (1..100).collect(),
        vec![],
    )
    .backend(&h.backend);
    let one_at_a_time = streamtable::commit::CommitOptions {
        runner: streamtable::scheduled::runner::Runner::new(1),
        ..Default::default()
    };
    streamtable::commit::commit_pending_with(&faulty, &tables, &one_at_a_time, None)
        .await
        .expect_err("injected crash");
    let resumed = commit_pending(&h.backend, &tables).await.expect("resume");
    let dl = resumed
        .tables
        .iter()
        .find(|t| t.table == "dead_letters")
        .expect("dead_letters");
    assert!(dl.already_committed);
    let orders = resumed
        .tables
        .iter()
        .find(|t| t.table == "orders")
        .expect("orders");
    assert!(!orders.already_committed);
    let mut expected: Vec<Value> = json_keys(0, (0..30).filter(|o| *o != 3));
    expected.extend(json_keys(1, 0..20));
    assert_eq!(operations(&check_table(h, "orders", &expected)), ["append"]);
    assert_eq!(
        operations(&check_table(
            h,
            "dead_letters",
            &[serde_json::json!(["orders", 0, 3])]
        )),
        ["append"]
    );
}

/// Expiry deletes what only expired snapshots referenced; orphan clean-up deletes unreferenced
/// files; files of pending batches survive both.
pub async fn maintenance_deletes_only_unreferenced_files(h: &Harness) {
    let tables = h.tables();
    for i in 0..6 {
        h.ingestor()
            .handle(&event(&records("orders", 0, i * 10..(i + 1) * 10)))
            .await
            .expect("ingest");
        commit_pending(&h.backend, &tables).await.expect("commit");
    }
    compact_all(&h.backend, &tables, &opts())
        .await
        .expect("compact");
    // A pending (uncommitted) batch, and orphans as crashed invocations leave them.
    let crash = |partition: i32| async move {
        h.ingestor_with_state(FaultyState::new(
            h.backend.state.clone(),
            vec![Fault::CrashBeforeAdvance],
        ))
        .handle(&event(&records("orders", partition, 0..5)))
        .await
        .expect_err("crash leaves an orphan");
    };
    // Partition 3: the ESM's retry delivers a longer batch, so the crashed files stay orphans
    // once the checkpoint has passed them. Partition 4: not retried yet, so a retry could still
    // re-upload and register the very same files: they must stay.
    crash(3).await;
    h.ingestor()
        .handle(&event(&records("orders", 3, 0..8)))
        .await
        .expect("retry");
    commit_pending(&h.backend, &tables).await.expect("commit");
    crash(4).await;
    let waiting: Vec<String> = h
        .backend
        .warehouse
        .list(
            &h.backend
                .warehouse
                .table_location(&h.backend.namespace, "orders"),
        )
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.location)
        .filter(|l| l.contains("/orders-4-"))
        .collect();
    assert!(!waiting.is_empty());
    h.ingestor()
        .handle(&event(&records("orders", 0, 60..70)))
        .await
        .expect("pending batch");

    let location = h
        .backend
        .warehouse
        .table_location(&h.backend.namespace, "orders");
    let before: BTreeSet<String> = h
        .backend
        .warehouse
        .list(&location)
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.location)
        .collect();
    let aggressive = streamtable::maintenance::MaintenanceOptions {
        keep_last_snapshots: 1,
        snapshot_retention_ms: 0,
        orphan_grace_ms: -60_000,
        ..Default::default()
    };
    let report = maintain_all(&h.backend, &tables, &aggressive)
        .await
        .expect("maintenance");
    let orders = report
        .iter()
        .find(|m| m.table == "orders")
        .expect("orders report");
    assert_eq!(orders.snapshots_expired, 7);
    // The table now states the retention applied, for Athena's VACUUM and Spark's expiry.
    let (table, _) = h
        .backend
        .catalog
        .load(&tables.ident("orders"))
        .await
        .expect("load")
        .expect("orders");
    let props = table.metadata().properties();
    for (k, v) in [
        ("vacuum_max_snapshot_age_seconds", "0"),
        ("vacuum_min_snapshots_to_keep", "1"),
        ("history.expire.max-snapshot-age-ms", "0"),
        ("history.expire.min-snapshots-to-keep", "1"),
    ] {
        assert_eq!(props.get(k).map(String::as_str), Some(v), "{k}");
    }
    assert!(
        orders.files_deleted >= 6 + 6,
        "micro-files and old manifests: {orders:?}"
    );
    assert!(orders.orphans_deleted >= 1, "{orders:?}");
    let after: BTreeSet<String> = h
        .backend
        .warehouse
        .list(&location)
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.location)
        .collect();
    assert!(after.len() < before.len());

    for w in &waiting {
        assert!(
            after.contains(w),
            "{w} may still be registered by a retry: kept"
        );
    }

    // The table still reads completely, and the pending batch's files are still there.
    let mut expected = json_keys(0, 0..60);
    expected.extend(json_keys(3, 0..8));
    check_table(h, "orders", &expected);
    for f in h.pending_files().await {
        let df: Value = serde_json::from_str(&f.data_file).expect("json");
        let path = df["file_path"].as_str().expect("path");
        assert!(after.contains(path), "pending file {path} was deleted");
    }
    // Committing it afterwards still works.
    commit_pending(&h.backend, &tables)
        .await
        .expect("commit after maintenance");
    let mut expected = json_keys(0, 0..70);
    expected.extend(json_keys(3, 0..8));
    check_table(h, "orders", &expected);
}

/// Commits triggered by landed batches: each commits what landed; two triggers in a row, or at
/// the same time, never commit within the interval of each other (nor of a scheduled commit),
/// and nothing landed is left behind.
pub async fn triggered_commits_are_spaced_by_the_interval(h: &Harness) {
    use std::time::{Duration, Instant};
    use streamtable::commit::CommitOptions;
    use streamtable::commit::trigger::{commit_when_due, last_commit_ms};

    let tables = h.tables();
    let options = CommitOptions {
        min_interval: Duration::from_millis(1500),
        ..CommitOptions::default()
    };
    let far = || Instant::now() + Duration::from_secs(60);
    let ing = h.ingestor();
    ing.handle(&event(&records("orders", 0, 0..10)))
        .await
        .expect("ingest");
    let first = commit_when_due(&h.backend, &tables, &options, far())
        .await
        .expect("first trigger");
    assert_eq!(first.report.expect("committed").files(), 1);
    let first_at = last_commit_ms(&h.backend).await.expect("last commit");
    assert!(first_at > 0);

    // Two triggers at once, for two new batches: they take turns, each a whole interval
    // after the commit before it.
    ing.handle(&event(&records("orders", 0, 10..20)))
        .await
        .expect("ingest");
    let (a, b) = tokio::join!(
        commit_when_due(&h.backend, &tables, &options, far()),
        async {
            ing.handle(&event(&records("orders", 1, 0..10)))
                .await
                .expect("ingest");
            commit_when_due(&h.backend, &tables, &options, far()).await
        }
    );
    let (a, b) = (a.expect("trigger a"), b.expect("trigger b"));
    let (fa, fb) = (
        a.report.map_or(0, |r| r.files()),
        b.report.map_or(0, |r| r.files()),
    );
    assert_eq!(fa + fb, 2, "both new batches committed");
    let last = last_commit_ms(&h.backend).await.expect("last commit");
    // One commit of both, an interval after the first; or two, an interval apart.
    let least = if fa == 1 && fb == 1 { 3000 } else { 1500 };
    assert!(
        last - first_at >= least,
        "the last commit {} ms after the first",
        last - first_at
    );
    assert!(h.backend.state.pending().await.expect("pending").is_empty());
    let mut expected = json_keys(0, 0..20);
    expected.extend(json_keys(1, 0..10));
    check_table(h, "orders", &expected);

    // A scheduled commit counts too: a trigger right after it waits.
    ing.handle(&event(&records("orders", 2, 0..5)))
        .await
        .expect("ingest");
    scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("scheduled run");
    let after_run = last_commit_ms(&h.backend).await.expect("last commit");
    assert!(after_run > last);
    ing.handle(&event(&records("orders", 2, 5..10)))
        .await
        .expect("ingest");
    let t = commit_when_due(&h.backend, &tables, &options, far())
        .await
        .expect("trigger after the schedule");
    assert_eq!(t.report.expect("committed").files(), 1);
    assert!(
        last_commit_ms(&h.backend).await.expect("last commit") - after_run >= 1500,
        "the trigger waited for the interval after the scheduled commit"
    );
}
