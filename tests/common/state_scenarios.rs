//! Partition state as batches write it: one state file per batch for every partition it
//! touched, and a state of the previous layout read and migrated with its dedup keys.

use streamtable::checkpoint::{PendingBatch, SourceAdvance, SourcePartition, StoredState};
use streamtable::generate::SourceRecord;
use streamtable::spec::PipelineSpec;

use super::{Harness, event};

/// Event time of the first order of the stored state below (2026-12-02T00:20:35Z).
const FIXTURE_MS: i64 = 1_796_170_835_019;

pub fn order(partition: i32, offset: i64, at_ms: i64, id: &str) -> SourceRecord {
    SourceRecord {
        topic: "orders".into(),
        partition,
        offset,
        timestamp_ms: at_ms,
        key: Some(id.as_bytes().to_vec()),
        value: Some(
            format!(
                r#"{{"order_id":"{id}","amount":"1.00","currency":"EUR","country":"DE","status":"paid","created_at":"{}"}}"#,
                streamtable::clock::rfc3339_ms(at_ms)
            )
            .into_bytes(),
        ),
        raw_value_field: None,
    }
}

/// The shipped spec's orders with its dedup (`orders_clean`) and its window.
pub fn orders_spec() -> PipelineSpec {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("infra/pipeline.toml");
    let text = std::fs::read_to_string(&path).expect("shipped spec");
    let mut spec = PipelineSpec::parse(&text, &path, &streamtable::process::Planner).expect("spec");
    spec.retain_tables(|t| t.name == "orders");
    spec
}

/// Replaces partition `source`'s stored state by `body` (kept in the item), as another release
/// would have written it: an advance that keeps the checkpoint, fenced like the idle flush.
async fn install_state(h: &Harness, source: &SourcePartition, body: Vec<u8>) {
    let checkpoint = h
        .backend
        .state
        .checkpoint(source)
        .await
        .expect("checkpoint");
    let stored = h
        .backend
        .state
        .partition_states(std::slice::from_ref(source))
        .await
        .expect("state")
        .pop()
        .flatten()
        .expect("a state");
    let seq = stored.seq + 1;
    let advance = SourceAdvance {
        source: source.clone(),
        from: checkpoint,
        to_next_offset: checkpoint.next_offset,
        newest_ms: -1,
        first_offset: -1,
        state: Some(StoredState {
            next_offset: checkpoint.next_offset,
            seq,
            bytes: body.len() as u64,
            body: Some(body),
            location: None,
            updated_at_ms: stored.updated_at_ms,
        }),
    };
    let batch = PendingBatch {
        source: source.clone(),
        first_offset: -(seq as i64),
        last_offset: -(seq as i64),
        more: Vec::new(),
        created_at_ms: stored.updated_at_ms,
        files: Vec::new(),
        files_location: None,
        delivery: Default::default(),
    };
    assert!(matches!(
        h.backend
            .state
            .advance(&[advance], &batch)
            .await
            .expect("advance"),
        streamtable::checkpoint::Advance::Advanced
    ));
}

/// A batch over four partitions writes one state file, which every partition's item names; the
/// next batch of two of them writes another holding their new keys only.
pub async fn a_batch_writes_one_state_file_for_every_partition_it_touched(mut h: Harness) {
    h.spec = orders_spec();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let sources: Vec<SourcePartition> = (0..4).map(|p| SourcePartition::new("orders", p)).collect();
    let batch = |from: i64, parts: &[i32]| -> Vec<SourceRecord> {
        parts
            .iter()
            .flat_map(|&p| {
                (from..from + 50)
                    .map(move |o| order(p, o, FIXTURE_MS + o * 100, &format!("o-{p}-{o}")))
            })
            .collect()
    };
    let files = || async {
        let root = format!(
            "{}/_state/partitions/orders/runs/",
            h.backend.warehouse.root()
        );
        let mut l: Vec<String> = h
            .backend
            .warehouse
            .list(&root)
            .await
            .expect("list")
            .into_iter()
            .map(|o| o.location)
            .collect();
        l.sort();
        l
    };
    h.ingestor()
        .handle(&event(&batch(0, &[0, 1, 2, 3])))
        .await
        .expect("ingest");
    let first = files().await;
    assert_eq!(first.len(), 1, "one state file for the batch: {first:?}");
    let stored = h
        .backend
        .state
        .partition_states(&sources)
        .await
        .expect("states");
    for s in &stored {
        let s = s.as_ref().expect("a state");
        assert_eq!(s.location.as_ref(), Some(&first[0]));
        assert!(s.body.is_none());
    }
    h.ingestor()
        .handle(&event(&batch(50, &[1, 3])))
        .await
        .expect("ingest");
    let second = files().await;
    assert_eq!(second.len(), 2, "{second:?}");
    let stored = h
        .backend
        .state
        .partition_states(&sources)
        .await
        .expect("states");
    let named: Vec<&str> = stored
        .iter()
        .map(|s| s.as_ref().and_then(|s| s.location.as_deref()).unwrap_or(""))
        .collect();
    assert_eq!(named[0], first[0]);
    assert_eq!(named[2], first[0]);
    assert_ne!(named[1], first[0]);
    assert_eq!(named[1], named[3]);
    // A copy of a key from the first batch, in the second's file's partition: still dropped.
    h.ingestor()
        .handle(&event(&[order(1, 100, FIXTURE_MS + 10_000, "o-1-7")]))
        .await
        .expect("ingest");
    streamtable::scheduled::run(&h.backend, &h.tables(), &Default::default())
        .await
        .expect("scheduled run");
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM orders_clean").await,
        300,
        "every order once, the copy dropped"
    );
}

/// A partition whose state the release before this layout wrote (40 orders, dedup keys and open
/// windows, kept in its item) goes on from it: a copy of one of its orders is dropped, and the
/// next write stores the keys as a state file.
pub async fn a_state_of_the_previous_layout_is_read_and_migrated(mut h: Harness) {
    h.spec = orders_spec();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let source = SourcePartition::new("orders", 0);
    let first: Vec<SourceRecord> = (0..40)
        .map(|o| order(0, o, FIXTURE_MS + o * 1_000, &format!("ord-{o:010}")))
        .collect();
    h.ingestor().handle(&event(&first)).await.expect("ingest");
    // The state as the previous release left it after those 40 records.
    let legacy =
        include_bytes!("../../crates/process/src/partition_state/testdata/layout3-orders-0.zst");
    install_state(&h, &source, legacy.to_vec()).await;
    // A fresh container: a copy of ord-0000000005 and a new order.
    h.ingestor()
        .handle(&event(&[
            order(0, 40, FIXTURE_MS + 45_000, "ord-0000000005"),
            order(0, 41, FIXTURE_MS + 46_000, "ord-0000000040"),
        ]))
        .await
        .expect("ingest on the old layout's state");
    let now = h
        .backend
        .state
        .partition_states(std::slice::from_ref(&source))
        .await
        .expect("state")
        .pop()
        .flatten()
        .expect("a state");
    assert!(
        now.location.as_deref().is_some_and(|l| l.ends_with(".run")),
        "the migrated keys are written to a state file: {now:?}"
    );
    streamtable::scheduled::run(&h.backend, &h.tables(), &Default::default())
        .await
        .expect("scheduled run");
    assert_eq!(
        super::count(
            &h,
            "SELECT COUNT(*) FROM orders_clean WHERE order_id = 'ord-0000000005'"
        )
        .await,
        1,
        "the old layout's key is remembered"
    );
    assert_eq!(
        super::count(&h, "SELECT COUNT(*) FROM orders_clean").await,
        41
    );
    assert_eq!(super::count(&h, "SELECT COUNT(*) FROM orders").await, 42);
}

/// A damaged or forged state naming a run outside the topic's state files fails the batch
/// (the event source mapping retries it; nothing lands), naming the partition and the object;
/// it is never read.
pub async fn a_state_naming_a_run_elsewhere_is_refused(mut h: Harness) {
    use streamtable::process::partition_state::keys::{Run, RunRef};
    use streamtable::process::partition_state::{PartitionState, TableState};

    h.spec = orders_spec();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let source = SourcePartition::new("orders", 0);
    h.ingestor()
        .handle(&event(&[order(0, 0, FIXTURE_MS, "o-1")]))
        .await
        .expect("ingest");
    let mut forged = PartitionState::default();
    let mut table = TableState::default();
    table.keys.runs.push(Run {
        at: RunRef {
            file: "/etc/passwd.run".into(),
            block: 0,
            count: 1,
            min_t: 0,
            max_t: i64::MAX / 2,
            merged: true,
            horizon: 0,
        },
        entries: None,
        filter: Default::default(),
    });
    forged.tables.insert("orders_clean".into(), table);
    let section = forged.seal(|_| None).expect("seal");
    let body = zstd::bulk::compress(&section.bytes, 1).expect("zstd");
    install_state(&h, &source, body).await;
    let e = h
        .ingestor()
        .handle(&event(&[order(0, 1, FIXTURE_MS + 1_000, "o-2")]))
        .await
        .expect_err("a forged state fails the batch");
    assert!(
        e.to_string().contains("/etc/passwd.run") && e.to_string().contains("orders-0"),
        "{e}"
    );
    assert_eq!(
        h.backend
            .state
            .checkpoint(&source)
            .await
            .expect("checkpoint")
            .next_offset,
        1,
        "nothing landed"
    );
}

/// A window's partial rows of a batch (a few rows) ride in the state file the batch writes
/// anyway instead of a file of their own, and the commit writes a round's into the table: the
/// view reads what it reads when every batch writes its own file (`plain`); orphan clean-up
/// keeps a carrying state file while its batch is pending, even once no state names it; and a
/// batch whose carrying file is gone stays pending, blocked, naming the file.
pub async fn a_window_s_partials_ride_in_the_state_file_and_land_with_the_commit(
    mut h: Harness,
    mut plain: Harness,
) {
    let now = streamtable::clock::now_ms();
    for x in [&mut h, &mut plain] {
        x.spec = orders_spec();
        x.tables().ensure_all(&x.backend).await.expect("tables");
        x.backend.state.upgrade(now).await.expect("layout");
    }
    let plain_ingestor = plain
        .ingestor()
        .with_options(streamtable::ingest::IngestOptions {
            max_carried_file_bytes: 0,
            ..plain.ingestor().options().clone()
        });
    // 24 batches over 4 partitions, a minute of event time each: every batch closes windows.
    let batch = |i: i64| -> Vec<SourceRecord> {
        (0..4)
            .flat_map(|p| {
                (0..25).map(move |o| {
                    let offset = i * 25 + o;
                    let at = FIXTURE_MS + i * 60_000 + o * 2_000;
                    order(p, offset, at, &format!("c-{p}-{offset}"))
                })
            })
            .collect()
    };
    let mut carried = 0;
    for i in 0..24 {
        let e = event(&batch(i));
        let s = h.ingestor().handle(&e).await.expect("ingest");
        carried += s.files_carried;
        let p = plain_ingestor.handle(&e).await.expect("ingest");
        assert_eq!(p.files_carried, 0);
        assert_eq!(
            s.files_written + s.files_carried,
            p.files_written,
            "the same files, {} of them carried",
            s.files_carried
        );
    }
    assert!(carried >= 20, "a window's partials ride along: {carried}");
    let partials = "orders_per_minute_partials";
    let pending = h.pending_files().await;
    let of_partials: Vec<_> = pending.iter().filter(|f| f.table == partials).collect();
    assert!(of_partials.len() >= 20, "{}", of_partials.len());
    // And the dedup's small files of these small batches (100 rows).
    assert_eq!(
        pending.iter().filter(|f| f.carried.is_some()).count() as u64,
        carried
    );
    assert!(
        of_partials
            .iter()
            .all(|f| f.carried.is_some() && f.data_file.is_empty())
    );
    let carrying: std::collections::BTreeSet<String> = of_partials
        .iter()
        .filter_map(|f| f.carried.as_ref().map(|c| c.file.clone()))
        .collect();
    assert!(
        plain
            .pending_files()
            .await
            .iter()
            .all(|f| f.carried.is_none())
    );

    // Orphan clean-up before the commit keeps every carrying file, named by a state or not.
    let aggressive = streamtable::maintenance::MaintenanceOptions {
        orphan_grace_ms: -1,
        ..Default::default()
    };
    let tables = h.tables();
    streamtable::maintenance::maintain_all(&h.backend, &tables, &aggressive)
        .await
        .expect("maintenance");
    for f in &carrying {
        assert!(
            h.backend.warehouse.stat(f).await.expect("stat").is_some(),
            "{f} carries a pending batch's rows"
        );
    }
    for x in [&h, &plain] {
        let report = streamtable::commit::commit_pending(&x.backend, &x.tables())
            .await
            .expect("commit");
        assert!(report.blocked.is_empty(), "{:?}", report.blocked);
    }
    let view = "SELECT window_start, window_end, country, orders, revenue FROM orders_per_minute ORDER BY window_start, country";
    let (got, want) = (
        super::query_rows(&h, view).await,
        super::query_rows(&plain, view).await,
    );
    assert!(want.len() >= 20, "{want:?}");
    assert_eq!(got, want, "the same windows either way");
    let clean = "SELECT order_id, amount, created_at FROM orders_clean ORDER BY order_id";
    let (got, want) = (
        super::query_rows(&h, clean).await,
        super::query_rows(&plain, clean).await,
    );
    assert_eq!(want.len(), 2400);
    assert_eq!(got, want, "the same deduplicated orders either way");
    // The round's carried rows went into one file per partition value.
    assert!(
        h.live_files(partials).await.len() < plain.live_files(partials).await.len(),
        "fewer, larger files"
    );
    // Committed, the files no state names go; those a state names stay.
    streamtable::maintenance::maintain_all(&h.backend, &tables, &aggressive)
        .await
        .expect("maintenance");
    let mut gone = 0;
    for f in &carrying {
        gone += usize::from(h.backend.warehouse.stat(f).await.expect("stat").is_none());
    }
    assert!(
        gone > 0,
        "some carrying files were kept only for their batches"
    );

    // A batch whose carrying file is gone is blocked, naming the file, and stays pending.
    h.ingestor()
        .handle(&event(&batch(24)))
        .await
        .expect("ingest");
    let lost = h
        .pending_files()
        .await
        .into_iter()
        .find_map(|f| f.carried)
        .expect("carried rows")
        .file;
    h.backend.warehouse.delete(&lost).await.expect("delete");
    let report = streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    assert_eq!(report.blocked.len(), 1, "{:?}", report.blocked);
    assert!(
        report.blocked[0].reason.contains(&lost),
        "{}",
        report.blocked[0].reason
    );
    assert_eq!(h.backend.state.pending().await.expect("pending").len(), 1);
}
