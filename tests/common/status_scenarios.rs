//! `streamtable status`'s view of a pipeline: checkpoints, landings, pending batches, commits
//! and compactions, and the last scheduled run, from the state store and the catalog.

use streamtable::commit::commit_pending;
use streamtable::status::gather;

use super::table_scenarios::sched;
use super::{Harness, event, records};

pub async fn status_shows_checkpoints_landings_pending_batches_and_commits(h: &Harness) {
    let tables = h.tables();
    let before = gather(&h.backend, &h.spec).await.expect("status");
    assert!(before.partitions.is_empty(), "{before:?}");
    assert!(before.tables.iter().all(|t| t.last_commit_ms.is_none()));
    assert!(before.last_run.is_none());

    // Partition 0 and 1 land and are committed by a scheduled run; then partition 1 lands
    // again and waits.
    let mut batch = records("orders", 0, 0..10);
    batch.extend(records("orders", 1, 0..4));
    h.ingestor().handle(&event(&batch)).await.expect("ingest");
    let report = streamtable::scheduled::run(&h.backend, &tables, &sched())
        .await
        .expect("scheduled run");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let committed_at = h.backend.clock.now_ms();
    h.ingestor()
        .handle(&event(&records("orders", 1, 4..9)))
        .await
        .expect("ingest");

    let s = gather(&h.backend, &h.spec).await.expect("status");
    let orders: Vec<(i32, i64, u64)> = s
        .partitions
        .iter()
        .filter(|p| p.topic == "orders")
        .map(|p| (p.partition, p.next_offset, p.pending_batches))
        .collect();
    assert_eq!(orders, [(0, 10, 0), (1, 9, 1)]);
    for p in s.partitions.iter().filter(|p| p.topic == "orders") {
        let landed = p.last_landed_ms.expect("a landing time");
        assert!(landed <= s.now_ms && s.now_ms - landed < 600_000, "{p:?}");
    }
    let p1 = &s.partitions[1];
    assert!(p1.oldest_pending_ms.is_some_and(|t| t >= committed_at - 1));
    let orders_table = s
        .tables
        .iter()
        .find(|t| t.table == "orders")
        .expect("orders");
    assert!(orders_table.last_commit_ms.is_some());
    assert!(orders_table.last_compaction_ms.is_none());
    let run = s.last_run.as_ref().expect("last run");
    assert!(run.failures.is_empty() && run.blocked_total == 0);

    // Once committed, the partition's landing time is the committed batch's.
    commit_pending(&h.backend, &tables).await.expect("commit");
    let s = gather(&h.backend, &h.spec).await.expect("status");
    assert_eq!(s.partitions[1].pending_batches, 0);
    assert_eq!(s.partitions[1].last_landed_ms, p1.last_landed_ms);
    let text = streamtable::cli::status::render(&s);
    assert!(
        text.contains("orders-1") && text.contains("no failures, nothing blocked"),
        "{text}"
    );
}
