//! `streamtable audit` (`src/audit`): it passes on what the pipeline landed (re-deliveries, bad
//! records, pending batches, and the gaps Kafka leaves — a transaction's marker inside a batch,
//! offsets the event source skipped between two — which the ledger of delivered offsets
//! tells apart) and names each seeded fault — a pending batch lost before its commit, an
//! offset range the checkpoint skipped without landing it, a row deleted from a data file, a
//! data file committed twice — by its partition and offsets.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use iceberg::transaction::{ApplyTransactionAction, Transaction};
use streamtable::audit::{Audit, audit};
use streamtable::checkpoint::{PendingBatch, SourceAdvance, SourcePartition};
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

/// The audit of partition `p` of the orders table.
fn part(a: &Audit, p: i32) -> &streamtable::audit::PartitionAudit {
    a.tables[0]
        .partitions
        .iter()
        .find(|x| x.partition == p)
        .unwrap_or_else(|| panic!("partition {p} audited: {a:?}"))
}

/// The audit, with `given_up` the batches the event source gave up on.
async fn audit_given_up(h: &Harness, given_up: &streamtable::audit::GivenUp) -> Audit {
    streamtable::audit::audit_with(
        &h.backend,
        &h.spec,
        &streamtable::audit::AuditOptions {
            given_up: Some(given_up),
            ..Default::default()
        },
    )
    .await
    .expect("audit")
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
    // Checkpoints in buckets, as on a new deployment.
    h.backend
        .state
        .upgrade(streamtable::clock::now_ms())
        .await
        .expect("layout");
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
    let first_batches = h.backend.state.pending().await.expect("pending");
    let round = commit_pending(&h.backend, &tables).await.expect("commit");
    // Each round checks its own files against what its batches were delivered.
    assert!(round.audit.ok(), "{:?}", round.audit);
    assert_eq!((round.audit.rounds, round.audit.delivered), (1, 30));
    ingest(records("orders", 0, 20..30)).await;
    let honest = run(h).await;
    assert!(honest.ok(), "{}", streamtable::cli::audit::render(&honest));
    let p0 = part(&honest, 0);
    assert_eq!((p0.rows, p0.dead_letters), (19, 1));
    assert_eq!(
        p0.pending,
        [[20, 29]],
        "the pending batch is not expected yet"
    );
    assert_eq!(p0.next_offset, 30);
    assert_eq!((p0.delivered, p0.ledger_from), (Some(20), Some(0)));

    // A pending batch covers its offsets from its checkpoint on: partition 3 (a marker at 2)
    // then a batch from 7 on, pending, after gaps at 5 and 6.
    let mut p3 = records("orders", 3, 0..5);
    p3.retain(|r| r.offset != 2);
    ingest(p3).await;
    commit_pending(&h.backend, &tables).await.expect("commit");
    ingest(records("orders", 3, 7..10)).await;
    let a = run(h).await;
    assert!(a.ok(), "{}", streamtable::cli::audit::render(&a));
    assert_eq!(part(&a, 3).pending, [[5, 9]]);
    commit_pending(&h.backend, &tables).await.expect("commit");

    // Kafka's gaps: partition 1 delivers 10..=19 but 15 (a transaction's marker), then from
    // 25 (20..=24 never delivered: aborted records, or skipped by the event source).
    let mut gappy = records("orders", 1, 10..20);
    gappy.retain(|r| r.offset != 15);
    ingest(gappy).await;
    ingest(records("orders", 1, 25..30)).await;
    let round = commit_pending(&h.backend, &tables).await.expect("commit");
    assert!(round.audit.ok(), "{:?}", round.audit);
    assert_eq!(round.audit.delivered, 9 + 5, "p1 10..=19 but 15, 25..=29");
    let a = run(h).await;
    assert!(a.ok(), "{}", streamtable::cli::audit::render(&a));
    let p1 = part(&a, 1);
    assert_eq!(p1.not_delivered, [[15, 15], [20, 24]]);
    assert_eq!((p1.not_delivered_offsets, p1.delivered), (6, Some(24)));
    assert!(
        streamtable::cli::audit::render(&a)
            .contains("never delivered (not counted as missing): 6 offset(s): 15, 20..=24")
    );

    // The event source gives up on a batch (partition 2, offsets 10..=14), writes it to its
    // on-failure destination, and goes on: the offsets no landed batch took that such a batch
    // holds are missing…
    ingest(records("orders", 2, 0..10)).await;
    ingest(records("orders", 2, 15..20)).await;
    commit_pending(&h.backend, &tables).await.expect("commit");
    let mut given_up = streamtable::audit::GivenUp::default();
    given_up
        .add(&event(&records("orders", 2, 10..15)))
        .expect("a failed batch");
    let a = audit_given_up(h, &given_up).await;
    assert!(!a.ok());
    let p2 = part(&a, 2);
    assert_eq!(
        (p2.skipped.clone(), p2.missing_offsets),
        (vec![[10, 14]], 5)
    );
    assert!(
        streamtable::cli::audit::render(&a).contains(
            "missing: skipped: 5 offset(s) no landed batch took, in batches the event source gave up on: 10..=14"
        )
    );
    // …where nothing says the event source gave up on them, they are Kafka's gaps (aborted
    // records between two transactions), listed.
    let a = run(h).await;
    assert!(a.ok(), "{}", streamtable::cli::audit::render(&a));
    assert_eq!(part(&a, 2).not_delivered, [[10, 14]]);
    // …until a replay lands them.
    let replayed = streamtable::replay::replay(
        &h.ingestor(),
        &h.backend,
        &h.spec,
        &event(&records("orders", 2, 10..15)),
    )
    .await
    .expect("replay");
    assert_eq!(replayed.len(), 1);
    commit_pending(&h.backend, &tables).await.expect("commit");
    let a = audit_given_up(h, &given_up).await;
    assert!(a.ok(), "{}", streamtable::cli::audit::render(&a));
    // 15 delivered by the event source, 5 landed by the replay.
    assert_eq!(part(&a, 2).delivered, Some(15));

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

    // A partition's first batch lost before its commit: the ledger starts at the second, but
    // the checkpoint remembers where the partition started.
    ingest(records("orders", 5, 0..10)).await;
    let lost = h.backend.state.pending().await.expect("pending");
    let intent = CommitIntent {
        id: "lost-first".into(),
        created_at_ms: 1,
        batches: lost
            .iter()
            .filter(|b| b.source.partition == 5)
            .map(|b| b.key())
            .collect(),
    };
    assert!(h.backend.state.begin_commit(&intent).await.expect("begin"));
    h.backend
        .state
        .finish_commit(&intent)
        .await
        .expect("finish");
    ingest(records("orders", 5, 10..20)).await;
    commit_pending(&h.backend, &tables).await.expect("commit");
    let a = run(h).await;
    assert_eq!(faults(&a, 5), (vec![[0, 9]], vec![]));
    assert_eq!(part(&a, 5).first_taken, Some(0));

    // An offset range skipped: the checkpoint of partition 1 moved from 30 to 40 by a batch
    // that landed nothing, then records from 40 on. Partition 1 has gaps of its own (above),
    // so its ledger counts rather than names: 10 of the records delivered are missing.
    let p1 = SourcePartition::new("orders", 1);
    let at = h.backend.state.checkpoint(&p1).await.expect("checkpoint");
    assert_eq!(at.next_offset, 30);
    let skip = PendingBatch {
        source: p1.clone(),
        first_offset: 30,
        last_offset: 39,
        more: Vec::new(),
        created_at_ms: 2,
        files: Vec::new(),
        files_location: None,
        delivery: Default::default(),
    };
    let advance = SourceAdvance {
        source: p1.clone(),
        from: at,
        to_next_offset: 40,
        newest_ms: -1,
        first_offset: -1,
        state: None,
    };
    h.backend
        .state
        .advance(&[advance], &skip)
        .await
        .expect("advance");
    ingest(records("orders", 1, 40..45)).await;
    let round = commit_pending(&h.backend, &tables).await.expect("commit");
    // The round's own check sees it too (and raises the alarm's metric).
    assert_eq!((round.audit.missing, round.audit.duplicated), (10, 0));
    assert!(
        round.audit.findings[0]
            .contains("orders-1: 10 of the 15 records delivered in offsets 30..=44"),
        "{:?}",
        round.audit
    );
    let a = run(h).await;
    assert!(!a.ok());
    let p1 = part(&a, 1);
    assert_eq!(
        p1.missing_offsets,
        10,
        "{}",
        streamtable::cli::audit::render(&a)
    );
    assert_eq!(
        (p1.short[0].delivered, p1.short[0].found),
        (39, 29),
        "{:?}",
        p1.short
    );
    assert_eq!(p1.short[0].holes, [[15, 15], [20, 24], [30, 39]]);

    // A row deleted from a data file: the first batch's file rewritten without partition 0's
    // offset 7, as a faulty rewrite would.
    delete_row(h, &first_batches, 0, 7).await;
    assert_eq!(faults(&run(h).await, 0), (vec![[7, 7], [30, 39]], vec![]));

    // A data file committed twice: partition 1's next batch appended again by hand.
    ingest(records("orders", 1, 45..50)).await;
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
        (vec![], vec![45, 46, 47, 48, 49]),
        "{}",
        streamtable::cli::audit::render(&a)
    );
    let dup = &part(&a, 1).duplicates[0];
    assert_eq!((dup.in_table, dup.in_dead_letters), (2, 0));
    // Named with the files that hold it: the original and its copy, each with its snapshot.
    assert_eq!(dup.files.len(), 2, "{:?}", dup.files);
    assert!(
        dup.files
            .iter()
            .any(|f| f.contains("-copy.parquet (snapshot ")),
        "{:?}",
        dup.files
    );
    let text = streamtable::cli::audit::render(&a);
    for says in [
        "missing: offsets 7..=7",
        "missing: offsets 30..=39",
        "missing: 10 of the 44 records delivered in offsets 0..=49",
        "found twice: offset 45 (2 row(s) in orders",
        "audit: FAILED",
    ] {
        assert!(text.contains(says), "{says}:\n{text}");
    }
    // Partition 3's checkpoint moves from 10 to 15 past records that never landed.
    let p3 = SourcePartition::new("orders", 3);
    let at = h.backend.state.checkpoint(&p3).await.expect("checkpoint");
    let skip = PendingBatch {
        source: p3.clone(),
        first_offset: at.next_offset,
        last_offset: at.next_offset + 4,
        more: Vec::new(),
        created_at_ms: 3,
        files: Vec::new(),
        files_location: None,
        delivery: Default::default(),
    };
    let advance = SourceAdvance {
        source: p3,
        from: at,
        to_next_offset: at.next_offset + 5,
        newest_ms: -1,
        first_offset: -1,
        state: None,
    };
    h.backend
        .state
        .advance(&[advance], &skip)
        .await
        .expect("advance");
    commit_pending(&h.backend, &tables).await.expect("commit");

    // --since: each partition from its first offset stamped at or after the time on (offset o
    // is stamped base + o s): the row deleted at 7 is before it, the lost batch is not.
    let since = streamtable::audit::audit_with(
        &h.backend,
        &h.spec,
        &streamtable::audit::AuditOptions {
            since_ms: Some(1_795_946_400_000 + 20_000),
            ..Default::default()
        },
    )
    .await
    .expect("audit since");
    assert_eq!(faults(&since, 0), (vec![[30, 39]], vec![]));
    assert_eq!(part(&since, 0).verified_from, 20);
    // Partition 3 has nothing stamped since: audited from after its last offset found (here
    // from its ledger entry holding that, which has gaps inside), so the 5 records its
    // checkpoint moved past are missing.
    assert_eq!(part(&since, 3).missing_offsets, 5, "{since:?}");
    // Partition 1's ledger range holding the cut starts at 0: counted whole, its loss seen.
    assert_eq!(part(&since, 1).missing_offsets, 10);
    assert!(!since.ok());

    // --since T where the rows right after T were deleted after their commit (by another
    // engine): the ledger's time marks start the partition at or before T's records — here
    // at the start of the one batch that landed them — not at the first row found after T.
    ingest(records("orders", 6, 0..30)).await;
    let batches: Vec<PendingBatch> = h
        .backend
        .state
        .pending()
        .await
        .expect("pending")
        .into_iter()
        .filter(|b| b.source.partition == 6)
        .collect();
    commit_pending(&h.backend, &tables).await.expect("commit");
    delete_rows(h, &batches, 6, &[20, 21, 22, 23, 24]).await;
    let since = streamtable::audit::audit_with(
        &h.backend,
        &h.spec,
        &streamtable::audit::AuditOptions {
            since_ms: Some(1_795_946_400_000 + 20_000),
            only: Some("orders"),
            ..Default::default()
        },
    )
    .await
    .expect("audit since");
    assert_eq!(faults(&since, 6), (vec![[20, 24]], vec![]));

    // Only a topic's table can be audited, by name.
    let e = audit(&h.backend, &h.spec, Some("nope"))
        .await
        .expect_err("unknown table")
        .to_string();
    assert!(e.contains("audit one of: orders"), "{e}");
}

/// Rewrites the `orders` data file of `batches` without the row of partition `p`, offset
/// `offset`, and replaces it in the table (as a faulty compaction would).
async fn delete_row(h: &Harness, batches: &[PendingBatch], p: i32, offset: i64) {
    delete_rows(h, batches, p, &[offset]).await;
}

/// [`delete_row`] of the rows at `offsets`.
async fn delete_rows(h: &Harness, batches: &[PendingBatch], p: i32, doomed: &[i64]) {
    use arrow_array::{Array, Int32Array, Int64Array};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let tables = h.tables();
    let ident = tables.ident("orders");
    let (table, _) = h
        .backend
        .catalog
        .load(&ident)
        .await
        .expect("load")
        .expect("orders");
    let pending = batches
        .iter()
        .flat_map(|b| b.files.iter())
        .find(|f| f.table == "orders")
        .expect("an orders file");
    let json: serde_json::Value = serde_json::from_str(&pending.data_file).expect("json");
    let path = json["file_path"].as_str().expect("path").to_string();
    let bytes = h.backend.warehouse.read(&path).await.expect("read");
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .expect("parquet")
        .build()
        .expect("reader");
    let mut kept = Vec::new();
    let mut schema = None;
    for batch in reader {
        let batch = batch.expect("batch");
        schema.get_or_insert_with(|| batch.schema());
        let col = |name: &str| batch.column_by_name(name).expect(name).clone();
        let parts = col("kafka_partition");
        let offsets = col("kafka_offset");
        let parts = parts.as_any().downcast_ref::<Int32Array>().expect("int");
        let offsets = offsets.as_any().downcast_ref::<Int64Array>().expect("long");
        let keep: arrow_array::BooleanArray = (0..batch.num_rows())
            .map(|i| Some(!(parts.value(i) == p && doomed.contains(&offsets.value(i)))))
            .collect();
        kept.push(datafusion::arrow::compute::filter_record_batch(&batch, &keep).expect("filter"));
    }
    let schema = schema.expect("rows");
    let rows: usize = kept.iter().map(|b| b.num_rows()).sum();
    assert_eq!(
        rows as u64 + doomed.len() as u64,
        pending.rows,
        "the rows dropped"
    );
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, Arc::clone(&schema), None).expect("writer");
    for b in &kept {
        w.write(b).expect("write");
    }
    w.close().expect("close");
    let rewritten = path.replace(".parquet", "-rewritten.parquet");
    let size = buf.len();
    h.backend
        .warehouse
        .write(&rewritten, buf.into())
        .await
        .expect("write");
    let one: Vec<PendingBatch> = batches.to_vec();
    let added: Vec<_> = super::pending_data_files(&table, &one, "orders", |j| {
        let mut v: serde_json::Value = serde_json::from_str(j).expect("json");
        if v["file_path"].as_str() == Some(path.as_str()) {
            v["file_path"] = rewritten.clone().into();
            v["file_size_in_bytes"] = size.into();
            v["record_count"] = rows.into();
        }
        v.to_string()
    })
    .into_iter()
    .filter(|f| f.file_path() == rewritten)
    .collect();
    assert_eq!(added.len(), 1);
    let outcome = streamtable::table::replace::commit_replace(
        &h.backend.catalog,
        &ident,
        &HashSet::from([path]),
        &added,
        &HashMap::new(),
    )
    .await
    .expect("replace");
    assert!(matches!(
        outcome,
        streamtable::table::replace::ReplaceOutcome::Committed(_)
    ));
}
