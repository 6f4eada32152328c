//! `streamtable audit` (`src/audit.rs`): it passes on what the pipeline landed (re-deliveries,
//! bad records and pending batches included) and names each seeded fault — an offset range the
//! event source skipped, a pending batch lost before its commit, a data file committed twice —
//! by its partition and offsets.

use std::collections::HashMap;
use std::path::Path;

use iceberg::transaction::{ApplyTransactionAction, Transaction};
use streamtable::audit::{Audit, audit};
use streamtable::commit::commit_pending;
use streamtable::spec::PipelineSpec;
use streamtable::store::CommitIntent;

use super::{Harness, event, records};

const SPEC: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "amount", type = "decimal(18,2)", required = true },
  { name = "created_at", type = "timestamp", required = true },
]
"#;

/// (missing ranges, duplicated offsets) of partition `p` of the orders table.
fn faults(a: &Audit, p: i32) -> (Vec<[i64; 2]>, Vec<i64>) {
    let part = a.tables[0]
        .partitions
        .iter()
        .find(|x| x.partition == p)
        .unwrap_or_else(|| panic!("partition {p} audited: {a:?}"));
    (
        part.missing.clone(),
        part.duplicates.iter().map(|d| d.offset).collect(),
    )
}

async fn run(h: &Harness) -> Audit {
    audit(&h.backend, &h.spec, None).await.expect("audit")
}

pub async fn the_audit_accounts_for_every_offset_and_names_each_fault(h: &mut Harness) {
    h.spec = PipelineSpec::parse(
        SPEC,
        Path::new("audit.toml"),
        &streamtable::process::Planner,
    )
    .expect("spec");
    let tables = h.tables();
    let ingest = |recs: Vec<streamtable::generate::SourceRecord>| {
        let ing = h.ingestor();
        async move { ing.handle(&event(&recs)).await.expect("ingest") }
    };
    // Landed honestly: bad records, a re-delivery, then a batch still pending.
    let mut first = records("orders", 0, 0..20);
    first[3].value = Some(b"not json".to_vec());
    first.extend(records("orders", 1, 0..10));
    ingest(first.clone()).await;
    ingest(first).await;
    commit_pending(&h.backend, &tables).await.expect("commit");
    ingest(records("orders", 0, 20..30)).await;
    let honest = run(h).await;
    assert!(honest.ok(), "{}", streamtable::cli::audit::render(&honest));
    let p0 = &honest.tables[0].partitions[0];
    assert_eq!((p0.rows, p0.dead_letters), (19, 1));
    assert_eq!(
        p0.pending,
        [[20, 29]],
        "the pending batch is not expected yet"
    );
    assert_eq!(p0.next_offset, 30);

    // An offset range the event source skipped: partition 1 jumps from 10 to 15.
    ingest(records("orders", 1, 15..20)).await;
    commit_pending(&h.backend, &tables).await.expect("commit");
    let a = run(h).await;
    assert!(!a.ok());
    assert_eq!(faults(&a, 1), (vec![[10, 14]], vec![]));
    assert_eq!(faults(&a, 0), (vec![], vec![]), "partition 0 is whole");

    // A pending batch lost: its record removed without its files being committed.
    ingest(records("orders", 0, 30..40)).await;
    let lost = h.backend.state.pending().await.expect("pending");
    let intent = CommitIntent {
        id: "lost".into(),
        created_at_ms: 1,
        batches: lost.iter().map(|b| b.key()).collect(),
    };
    assert!(h.backend.state.begin_commit(&intent).await.expect("begin"));
    h.backend
        .state
        .finish_commit(&intent)
        .await
        .expect("finish");
    assert_eq!(faults(&run(h).await, 0), (vec![[30, 39]], vec![]));

    // A data file committed twice: partition 1's next batch appended again by hand.
    ingest(records("orders", 1, 20..25)).await;
    let pending = h.backend.state.pending().await.expect("pending");
    commit_pending(&h.backend, &tables).await.expect("commit");
    let (table, _) = h
        .backend
        .catalog
        .load(&tables.ident("orders"))
        .await
        .expect("load")
        .expect("orders");
    // The same rows under another name (Iceberg refuses the same path twice in one table).
    let mut copies = Vec::new();
    for f in pending
        .iter()
        .flat_map(|b| b.files.iter())
        .filter(|f| f.table == "orders")
    {
        let json: serde_json::Value = serde_json::from_str(&f.data_file).expect("json");
        let path = json["file_path"]
            .as_str()
            .expect("the data file's path")
            .to_string();
        let copy = path.replace(".parquet", "-copy.parquet");
        let bytes = h.backend.warehouse.read(&path).await.expect("read");
        h.backend
            .warehouse
            .write(&copy, bytes)
            .await
            .expect("write");
        copies.push((path, copy));
    }
    let files = super::pending_data_files(&table, &pending, "orders", |json| {
        copies
            .iter()
            .fold(json.to_string(), |j, (path, copy)| j.replace(path, copy))
    });
    assert!(!files.is_empty());
    let tx = Transaction::new(&table);
    let tx = tx
        .fast_append()
        .add_data_files(files)
        .set_snapshot_properties(HashMap::new())
        .apply(tx)
        .expect("apply");
    tx.commit(&h.backend.catalog).await.expect("append again");
    let a = run(h).await;
    assert_eq!(
        faults(&a, 1),
        (vec![[10, 14]], vec![20, 21, 22, 23, 24]),
        "{}",
        streamtable::cli::audit::render(&a)
    );
    let dup = &a.tables[0].partitions[1].duplicates[0];
    assert_eq!((dup.in_table, dup.in_dead_letters), (2, 0));
    let text = streamtable::cli::audit::render(&a);
    for says in [
        "missing: offsets 10..=14",
        "missing: offsets 30..=39",
        "found twice: offset 20 (2 row(s) in orders",
        "audit: FAILED",
    ] {
        assert!(text.contains(says), "{says}:\n{text}");
    }
    // Only a topic's table can be audited, by name.
    let e = audit(&h.backend, &h.spec, Some("nope"))
        .await
        .expect_err("unknown table")
        .to_string();
    assert!(e.contains("audit one of: orders"), "{e}");
}
