//! Pending batches that cannot be committed (a corrupt file list, a file outside its table, a
//! changed partitioning): reported and left pending, never blocking the other batches.

use serde_json::{Value, json};
use streamtable::checkpoint::{
    Advance, Checkpoint, PendingBatch, PendingFile, SourceAdvance, SourcePartition,
};
use streamtable::scheduled;

use super::table_scenarios::{check_table, sched};
use super::{Harness, event, records};

/// Records a forged pending batch for `source`, as a corrupt or tampered state item would.
async fn forge_batch(h: &Harness, topic: &str, partition: i32, files: Vec<PendingFile>) {
    let source = SourcePartition::new(topic, partition);
    let batch = PendingBatch {
        source: source.clone(),
        first_offset: 0,
        last_offset: 0,
        more: Vec::new(),
        created_at_ms: 1,
        files,
        files_location: None,
        delivery: Default::default(),
    };
    let advance = SourceAdvance {
        source,
        from: Checkpoint::INITIAL,
        to_next_offset: 1,
        newest_ms: -1,
        first_offset: -1,
        state: None,
    };
    let advanced = h
        .backend
        .state
        .advance(&[advance], &batch)
        .await
        .expect("advance");
    assert_eq!(advanced, Advance::Advanced);
}

/// A pending batch that cannot be committed (its file list is corrupt, a file lies outside its
/// table, its table now has another partitioning) is reported and left pending; every other
/// batch is committed. (One such batch once failed every run; a changed partition_by was once
/// committed with the wrong partition metadata.)
pub async fn batches_that_cannot_be_committed_do_not_block_the_others(h: &mut Harness) {
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    // A real file description, to tamper with.
    h.ingestor()
        .handle(&event(&records("orders", 0, 0..10)))
        .await
        .expect("ingest");
    let real = h.pending_files().await.remove(0);
    let mut forged_json: Value = serde_json::from_str(&real.data_file).expect("json");
    forged_json["file_path"] = json!("/etc/passwd");
    forge_batch(
        h,
        "orders",
        7,
        vec![PendingFile {
            data_file: forged_json.to_string(),
            ..real.clone()
        }],
    )
    .await;
    forge_batch(
        h,
        "orders",
        8,
        vec![PendingFile {
            data_file: "{not json".into(),
            ..real.clone()
        }],
    )
    .await;
    h.ingestor()
        .handle(&event(&records("payments", 0, 0..10)))
        .await
        .expect("ingest");

    let run = scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("run");
    let blocked: Vec<&str> = run
        .commit
        .blocked
        .iter()
        .map(|b| b.batch.as_str())
        .collect();
    assert_eq!(
        blocked,
        ["orders-7@0", "orders-8@0"],
        "{:?}",
        run.commit.blocked
    );
    assert!(
        run.commit.blocked[0]
            .reason
            .contains("outside the table's data directory")
    );
    assert!(run.commit.blocked[1].reason.contains("cannot be read"));
    check_table(h, "orders", &super::table_scenarios::json_keys(0, 0..10));
    check_table(h, "payments", &super::table_scenarios::json_keys(0, 0..10));
    assert_eq!(
        h.backend.state.pending().await.expect("pending").len(),
        2,
        "blocked batches stay"
    );
    // `streamtable tables` shows them, from the last run's status.
    let status = scheduled::last_run(&h.backend)
        .await
        .expect("status")
        .expect("a run finished");
    let shown = streamtable::cli::table_list::render_last_run(&status, status.finished_at_ms);
    assert!(shown.contains("blocked: 2 pending batches"), "{shown}");
    assert!(
        shown.contains("orders-7@0") && shown.contains("outside the table's data directory"),
        "{shown}"
    );

    // partition_by changed in the spec: the table is refused (its batches wait), the others go on.
    let day_spec = h.spec.clone();
    let orders = h
        .spec
        .tables
        .iter_mut()
        .find(|t| t.name == "orders")
        .expect("orders");
    orders.partition_by[0].transform = iceberg::spec::Transform::Hour;
    h.ingestor()
        .handle(&event(&records("orders", 0, 10..20)))
        .await
        .expect("ingest with hour partitioning");
    h.ingestor()
        .handle(&event(&records("payments", 0, 10..20)))
        .await
        .expect("ingest");
    // A batch of the refused table's topic that landed only dead letters: committed, its
    // round going on without the refused table's ledger (which once held every round up).
    let mut bad = records("orders", 1, 0..5);
    for r in &mut bad {
        r.value = Some(b"not json".to_vec());
    }
    h.ingestor().handle(&event(&bad)).await.expect("ingest bad");
    let run = scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("run");
    let dead = run
        .commit
        .tables
        .iter()
        .find(|t| t.table == "dead_letters")
        .map(|t| t.rows);
    assert_eq!(dead, Some(5), "{:?}", run.commit);
    assert!(
        h.backend
            .state
            .commit_intent()
            .await
            .expect("intent")
            .is_none(),
        "no round left hanging"
    );
    let refused = run
        .failures
        .iter()
        .find(|f| f.table.as_deref() == Some("orders"))
        .expect("orders refused");
    assert!(refused.error.contains("partition_by"), "{}", refused.error);
    let status = scheduled::last_run(&h.backend)
        .await
        .expect("status")
        .expect("a run finished");
    let shown = streamtable::cli::table_list::render_last_run(&status, status.finished_at_ms);
    assert!(
        shown.contains("failed (commit): orders: ") && shown.contains("partition_by"),
        "{shown}"
    );
    check_table(h, "payments", &super::table_scenarios::json_keys(0, 0..20));
    check_table(h, "orders", &super::table_scenarios::json_keys(0, 0..10));

    // Back to day(): the files written for hour() are still not registered under day().
    h.spec = day_spec;
    let run = scheduled::run(&h.backend, &h.tables(), &sched())
        .await
        .expect("run");
    let hour_files = run
        .commit
        .blocked
        .iter()
        .find(|b| b.batch == "orders-0@10")
        .expect("hour-partitioned batch blocked");
    assert!(
        hour_files.reason.contains("hour(created_at)"),
        "{}",
        hour_files.reason
    );
    check_table(h, "orders", &super::table_scenarios::json_keys(0, 0..10));
}
