//! Committers that overlap: a committer held between its history check and its swap while
//! another commits the same intent (an overlapping scheduled run, a trigger, a zombie whose
//! lease ran out), a second append under a commit id the table already has, and the commit
//! lease that keeps committers apart. Each commit id lands once in each table.

use std::collections::HashMap;

use iceberg::transaction::{ApplyTransactionAction, Transaction};
use streamtable::clock::ManualClock;
use streamtable::commit::{CommitOptions, commit_pending_with};
use streamtable::generate::SourceRecord;
use streamtable::table::COMMIT_ID_PROPERTY;

use super::faults::HookedPointers;
use super::{Harness, event};

const BASE_MS: i64 = 1_795_946_400_000;
const NOW_MS: i64 = BASE_MS + 600_000;

fn orders_and_payments(n: i64) -> Vec<SourceRecord> {
    let at = |ms: i64| streamtable::clock::rfc3339_ms(BASE_MS + ms);
    let mut out = Vec::new();
    for i in 0..n {
        let p = (i % 2) as i32;
        out.push(SourceRecord {
            topic: "orders".into(),
            partition: p,
            offset: i / 2,
            timestamp_ms: BASE_MS + i,
            key: Some(format!("o-{i}").into_bytes()),
            value: Some(format!(
                r#"{{"order_id":"o-{i}","customer_id":"c-{i}","amount":"10.00","currency":"EUR","country":"DE","status":"paid","created_at":"{}"}}"#,
                at(i * 100)
            ).into_bytes()),
            raw_value_field: None,
        });
        out.push(SourceRecord {
            topic: "payments".into(),
            partition: p,
            offset: i / 2,
            timestamp_ms: BASE_MS + i,
            key: Some(format!("pay-{i}").into_bytes()),
            value: Some(format!(
                r#"{{"payment_id":"pay-{i}","order_id":"o-{i}","amount":"10.00","method":"card","status":"ok","attempted_at":"{}"}}"#,
                at(i * 100 + 5_000)
            ).into_bytes()),
            raw_value_field: None,
        });
    }
    out
}

/// How many snapshots of `table` carry each commit id.
async fn commit_ids(h: &Harness, table: &str) -> HashMap<String, usize> {
    let (t, _) = h
        .backend
        .catalog
        .load(&h.tables().ident(table))
        .await
        .expect("load")
        .expect("table exists");
    let mut out = HashMap::new();
    for s in t.metadata().snapshots() {
        if let Some(id) = s.summary().additional_properties.get(COMMIT_ID_PROPERTY) {
            *out.entry(id.clone()).or_insert(0) += 1;
        }
    }
    out
}

/// Every commit id is in each of `tables`' histories at most once.
async fn each_commit_id_once(h: &Harness, tables: &[&str]) {
    for table in tables {
        let ids = commit_ids(h, table).await;
        assert!(
            ids.values().all(|n| *n == 1),
            "{table}: a commit id landed twice: {ids:?}"
        );
    }
}

pub async fn a_held_committer_and_an_overlapping_one_land_each_commit_once(mut h: Harness) {
    h.spec = super::shipped_spec();
    h.spec
        .retain_tables(|t| t.name == "orders" || t.name == "payments");
    let clock = ManualClock::new(NOW_MS);
    h.backend.clock = clock.clone();
    let tables = h.tables();
    for name in tables.tables.keys() {
        tables.ensure(&h.backend, name).await.expect("ensure");
    }
    const N: i64 = 400;
    h.ingestor()
        .handle(&event(&orders_and_payments(N)))
        .await
        .expect("ingest");

    // Committer A is held right before its swap of the join table; meanwhile its lease runs
    // out and committer B takes it, resumes A's intent and commits every table.
    let (b_backend, b_tables, b_clock) = (h.backend.clone(), tables.clone(), clock.clone());
    let hook: super::faults::Hook = Box::new(move || {
        Box::pin(async move {
            b_clock.advance(3_600_000);
            let report = commit_pending_with(
                &b_backend,
                &b_tables,
                &CommitOptions::default(),
                Some(std::time::Instant::now() + std::time::Duration::from_secs(60)),
            )
            .await
            .expect("committer B");
            assert!(!report.lease_busy, "A's lease had run out");
            assert_eq!(report.rounds, 1, "{report:?}");
        })
    });
    let held =
        HookedPointers::holding(h.backend.catalog.pointers().clone(), "order_payments", hook);
    let a_backend = held.backend(&h.backend);
    let a = commit_pending_with(
        &a_backend,
        &tables,
        &CommitOptions::default(),
        Some(std::time::Instant::now() + std::time::Duration::from_secs(60)),
    )
    .await
    .expect("committer A");
    assert!(!a.lease_busy);

    each_commit_id_once(&h, &["orders", "payments", "order_payments"]).await;
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, N);
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM payments").await, N);
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM order_payments").await,
        N,
        "each order joined its payment once"
    );
    assert_eq!(
        super::count(&h, "SELECT COUNT(DISTINCT order_id) FROM order_payments").await,
        N
    );
    assert!(h.backend.state.pending().await.expect("pending").is_empty());
}

/// An append under a commit id the table's history already has is refused at the swap, not
/// only by the check before the append: the library's own conflict retry re-applies an append
/// on the new snapshot, and only the swap sees that snapshot.
pub async fn an_append_under_a_commit_id_the_table_has_is_refused_at_the_swap(mut h: Harness) {
    h.spec.retain_tables(|t| t.name == "orders");
    let tables = h.tables();
    let ingest = |from: i64| {
        let records: Vec<SourceRecord> = orders_and_payments(8)
            .into_iter()
            .filter(|r| r.topic == "orders")
            .map(|mut r| {
                r.offset += from;
                r
            })
            .collect();
        event(&records)
    };
    h.ingestor().handle(&ingest(0)).await.expect("ingest 1");
    let first = h.backend.state.pending().await.expect("pending");
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    let ids = commit_ids(&h, "orders").await;
    let (id, _) = ids.iter().next().expect("one commit");
    let id = id.clone();
    assert_eq!(first.len(), 1);

    // Other files, appended under the same commit id through Iceberg's own transaction.
    h.ingestor().handle(&ingest(100)).await.expect("ingest 2");
    let second = h.backend.state.pending().await.expect("pending");
    let (table, _) = h
        .backend
        .catalog
        .load(&tables.ident("orders"))
        .await
        .expect("load")
        .expect("orders");
    let files = super::pending_data_files(&table, &second, "orders", str::to_string);
    assert!(!files.is_empty());
    let tx = Transaction::new(&table);
    let tx = tx
        .fast_append()
        .add_data_files(files)
        .set_snapshot_properties(HashMap::from([(
            COMMIT_ID_PROPERTY.to_string(),
            id.clone(),
        )]))
        .apply(tx)
        .expect("apply");
    let err = tx
        .commit(&h.backend.catalog)
        .await
        .expect_err("a second snapshot with the same commit id");
    assert!(
        err.to_string().contains("already in the table's history"),
        "{err}"
    );
    assert_eq!(commit_ids(&h, "orders").await.get(&id), Some(&1));
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, 8);
}

/// While one committer holds the commit lease, another waits for it and, when its deadline
/// comes first, commits nothing (and says so).
pub async fn a_committer_waits_for_the_lease_and_gives_up_at_its_deadline(mut h: Harness) {
    h.spec.retain_tables(|t| t.name == "orders");
    let tables = h.tables();
    let records: Vec<SourceRecord> = orders_and_payments(4)
        .into_iter()
        .filter(|r| r.topic == "orders")
        .collect();
    h.ingestor().handle(&event(&records)).await.expect("ingest");
    let deadline = || Some(std::time::Instant::now() + std::time::Duration::from_millis(600));
    let held = streamtable::commit::lease::Lease::acquire(
        &h.backend,
        "trigger",
        std::time::Instant::now() + std::time::Duration::from_secs(30),
    )
    .await
    .expect("lease")
    .expect("free");
    let busy = commit_pending_with(&h.backend, &tables, &CommitOptions::default(), deadline())
        .await
        .expect("commit");
    assert!(busy.lease_busy, "{busy:?}");
    assert_eq!(busy.batches, 0);
    held.release(&h.backend).await;
    let done = commit_pending_with(&h.backend, &tables, &CommitOptions::default(), deadline())
        .await
        .expect("commit");
    assert!(!done.lease_busy);
    assert_eq!(done.batches, 1);
}

/// Rounds bounded by bytes (here: one batch each) whose units — each table's part and the
/// interval join — run in parallel, 4 at a time: every batch is committed in a round of its
/// own, every commit id lands once per table, every order and payment once, each order joined
/// to its payment once, and the rounds' audits find every delivered record once.
pub async fn rounds_bounded_by_bytes_with_parallel_units_land_each_batch_once(mut h: Harness) {
    h.spec = super::shipped_spec();
    h.spec
        .retain_tables(|t| t.name == "orders" || t.name == "payments");
    h.backend.clock = ManualClock::new(NOW_MS);
    let tables = h.tables();
    const N: i64 = 300;
    let records = orders_and_payments(N);
    // Three deliveries of both topics.
    for chunk in records.chunks(records.len() / 3) {
        h.ingestor().handle(&event(chunk)).await.expect("ingest");
    }
    let pending = h.backend.state.pending().await.expect("pending").len() as u64;
    assert!(pending >= 3, "at least a batch per delivery: {pending}");
    let mut options = CommitOptions {
        max_round_bytes: 1,
        max_rounds: 1,
        ..CommitOptions::default()
    };
    options.runner = streamtable::scheduled::runner::Runner::new(4);
    let deadline = || Some(std::time::Instant::now() + std::time::Duration::from_secs(120));
    // A run of one round leaves the rest, counted by batches (not what fits one round).
    let first = commit_pending_with(&h.backend, &tables, &options, deadline())
        .await
        .expect("commit");
    assert_eq!((first.rounds, first.batches), (1, 1), "{first:?}");
    assert_eq!(first.backlog.batches, pending - 1, "{:?}", first.backlog);
    assert!(!first.backlog.more);
    options.max_rounds = 100;
    let report = commit_pending_with(&h.backend, &tables, &options, deadline())
        .await
        .expect("commit");
    assert_eq!(
        report.rounds,
        pending - 1,
        "one batch per round: {report:?}"
    );
    assert_eq!(report.batches, pending - 1);
    assert_eq!(report.backlog.batches, 0);
    for r in [&first, &report] {
        assert!(r.audit.ok(), "{:?}", r.audit);
    }
    assert_eq!(first.audit.rounds + report.audit.rounds, pending);
    assert_eq!(first.audit.delivered + report.audit.delivered, 2 * N as u64);
    each_commit_id_once(&h, &["orders", "payments", "order_payments"]).await;
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, N);
    assert_eq!(
        super::count(&h, "SELECT COUNT(DISTINCT order_id) FROM orders").await,
        N
    );
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM payments").await, N);
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM order_payments").await,
        N,
        "each order joined its payment once"
    );
    assert!(h.backend.state.pending().await.expect("pending").is_empty());
}
