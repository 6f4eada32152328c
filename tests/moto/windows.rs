//! Windows and dedup on S3, DynamoDB and Glue (the moto server) against a brute-force oracle:
//! the partition state rides in the DynamoDB transaction with the checkpoint (see
//! `common/window_scenarios.rs`).

use crate::common;
use crate::common::window_scenarios::{steps, windows_equal_the_oracle};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]
    #[test]
    fn windows_and_dedup_equal_a_brute_force_oracle(seed in any::<u64>(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async { windows_equal_the_oracle(common::moto().await, seed, steps).await });
    }
}

#[tokio::test]
async fn idle_partitions_close_their_windows_at_the_topics_watermark() {
    common::idle_scenarios::idle_partitions_close_their_windows_at_the_topics_watermark(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn a_changed_window_sql_is_carried_over_restarted_or_refused_never_a_panic() {
    common::spec_change_scenarios::a_changed_window_sql_is_carried_over_restarted_or_refused_never_a_panic(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn an_older_release_keeps_the_state_of_a_table_it_does_not_know() {
    common::spec_change_scenarios::an_older_release_keeps_the_state_of_a_table_it_does_not_know(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn a_record_from_year_9999_does_not_move_the_watermark() {
    common::event_time_scenarios::a_record_from_year_9999_does_not_move_the_watermark(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn an_idle_partition_moves_to_the_lowest_active_watermark() {
    common::event_time_scenarios::an_idle_partition_moves_to_the_lowest_active_watermark(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn a_batch_writes_one_state_file_for_every_partition_it_touched() {
    common::state_scenarios::a_batch_writes_one_state_file_for_every_partition_it_touched(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn a_state_of_the_previous_layout_is_read_and_migrated() {
    common::state_scenarios::a_state_of_the_previous_layout_is_read_and_migrated(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn a_state_naming_a_run_elsewhere_is_refused() {
    common::state_scenarios::a_state_naming_a_run_elsewhere_is_refused(common::moto().await).await;
}

#[tokio::test]
async fn a_window_s_partials_ride_in_the_state_file_and_land_with_the_commit() {
    common::state_scenarios::a_window_s_partials_ride_in_the_state_file_and_land_with_the_commit(
        common::moto().await,
        common::moto().await,
    )
    .await;
}

/// The states of a batch's partitions share items, 16 partitions to one under a kilobyte (a
/// batch of 64 stateful partitions writes 4, where it wrote 64), and a state in the
/// per-partition item of the layout before is read, carried on (its dedup keys too) and moved:
/// that item becomes a marker an older release refuses, so an invocation of it still in flight
/// cannot advance from the old state nor start one afresh.
#[tokio::test]
async fn states_share_bucket_items_and_the_layout_before_moves_into_them() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use std::collections::HashMap;

    let mut h = common::moto().await;
    h.spec = common::state_scenarios::orders_spec();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let table = {
        let at = h
            .catalog_args
            .iter()
            .position(|a| a == "--database")
            .unwrap();
        h.catalog_args[at + 1].replace('_', "-")
    };
    let dynamo = aws_sdk_dynamodb::Client::new(&streamtable::aws::load_config().await);
    let item = |pk: String| {
        let (dynamo, table) = (dynamo.clone(), table.clone());
        async move {
            dynamo
                .get_item()
                .table_name(table)
                .key("pk", AttributeValue::S(pk))
                .key("sk", AttributeValue::S("state".into()))
                .consistent_read(true)
                .send()
                .await
                .expect("get item")
                .item
        }
    };
    // DynamoDB's item size: names and values (a number: a byte per two digits, plus one).
    let size = |i: &HashMap<String, AttributeValue>| -> usize {
        i.iter()
            .map(|(k, v)| {
                k.len()
                    + match v {
                        AttributeValue::S(s) => s.len(),
                        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
                        AttributeValue::B(b) => b.as_ref().len(),
                        other => panic!("unexpected attribute {other:?}"),
                    }
            })
            .sum()
    };

    // 64 partitions, 200 orders each: one batch.
    let orders: Vec<_> = (0..64)
        .flat_map(|p| {
            (0..200).map(move |o| {
                common::state_scenarios::order(
                    p,
                    o,
                    1_796_170_835_019 + o * 500,
                    &format!("o-{p}-{o}"),
                )
            })
        })
        .collect();
    h.ingestor()
        .handle(&common::event(&orders))
        .await
        .expect("ingest");
    for b in 0..4 {
        let i = item(format!("state#orders#b{b:06}"))
            .await
            .expect("a state bucket");
        let entries = i.keys().filter(|k| k.starts_with('q')).count();
        assert_eq!(
            entries,
            16,
            "bucket {b} holds 16 partitions: {:?}",
            i.keys()
        );
        assert!(size(&i) < 1024, "bucket {b} is {} bytes", size(&i));
    }
    assert!(item("state#orders#b000004".into()).await.is_none());

    // Partition 70's state as the layout before kept it: an item of its own.
    let store = streamtable::store::DynamoStateStore::new(dynamo.clone(), table.clone());
    let p70 = streamtable::checkpoint::SourcePartition::new("orders", 70);
    let first: Vec<_> = (0..40)
        .map(|o| {
            common::state_scenarios::order(
                70,
                o,
                1_796_170_835_019 + o * 1_000,
                &format!("ord-{o:010}"),
            )
        })
        .collect();
    h.ingestor()
        .handle(&common::event(&first))
        .await
        .expect("ingest 70");
    let bucket = item("state#orders#b000004".into())
        .await
        .expect("bucket of 70");
    let seq = bucket["q70"].clone();
    let stored = {
        use streamtable::store::CheckpointStore;
        store
            .partition_states(std::slice::from_ref(&p70))
            .await
            .unwrap()
            .pop()
            .flatten()
            .unwrap()
    };
    assert!(
        stored
            .location
            .as_deref()
            .is_some_and(|l| l.ends_with(".run")),
        "{stored:?}"
    );
    assert_eq!(seq, AttributeValue::N(stored.seq.to_string()));
    // Moved back by hand: the entry removed, the item of the layout before in its place.
    dynamo
        .delete_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("state#orders#b000004".into()))
        .key("sk", AttributeValue::S("state".into()))
        .send()
        .await
        .expect("delete bucket");
    dynamo
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("state#orders#70".into()))
        .item("sk", AttributeValue::S("state".into()))
        .item("next", AttributeValue::N(stored.next_offset.to_string()))
        .item("seq", AttributeValue::N(stored.seq.to_string()))
        .item("bytes", AttributeValue::N(stored.bytes.to_string()))
        .item(
            "updated_at_ms",
            AttributeValue::N(stored.updated_at_ms.to_string()),
        )
        .item(
            "location",
            AttributeValue::S(stored.location.clone().unwrap()),
        )
        .send()
        .await
        .expect("put legacy state");
    // A fresh container: a copy of ord-0000000005 (dropped by the dedup) and a new order.
    h.ingestor()
        .handle(&common::event(&[
            common::state_scenarios::order(70, 40, 1_796_170_835_019 + 45_000, "ord-0000000005"),
            common::state_scenarios::order(70, 41, 1_796_170_835_019 + 46_000, "ord-0000000040"),
        ]))
        .await
        .expect("ingest on the layout before");
    let bucket = item("state#orders#b000004".into())
        .await
        .expect("moved into the bucket");
    assert_eq!(
        bucket["q70"],
        AttributeValue::N((stored.seq + 1).to_string())
    );
    let marker = item("state#orders#70".into()).await.expect("the marker");
    assert_eq!(
        marker["seq"],
        AttributeValue::N((stored.seq + 1).to_string())
    );
    let body = marker["body"].as_b().expect("a body").as_ref().to_vec();
    let refused =
        streamtable::process::partition_state::PartitionState::decode(&body, "partition orders/70")
            .expect_err("a release before refuses the marker");
    assert!(refused.to_string().contains("newer release"), "{refused}");
    streamtable::scheduled::run(&h.backend, &h.tables(), &Default::default())
        .await
        .expect("scheduled run");
    assert_eq!(
        common::count(
            &h,
            "SELECT COUNT(*) FROM orders_clean WHERE order_id LIKE 'ord-%'"
        )
        .await,
        41,
        "the copy was dropped: the keys of the layout before were carried on"
    );
    assert_eq!(
        common::count(&h, "SELECT COUNT(*) FROM orders_clean").await,
        64 * 200 + 41
    );
}

/// The state bucket's conditions, raced: an older release advancing a partition's item of the
/// layout before between this release's read and its advance makes the advance a conflict
/// (re-planned from a fresh read, which then moves it); two stores creating one entry, one
/// wins; half an entry, or an entry whose bucket item was deleted, is refused by name.
#[tokio::test]
async fn state_bucket_writes_lose_every_race_they_should() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use streamtable::checkpoint::{
        Advance, PendingBatch, SourceAdvance, SourcePartition, StoredState,
    };
    use streamtable::store::{CheckpointStore, DynamoStateStore};

    let h = common::moto().await;
    let table = {
        let at = h
            .catalog_args
            .iter()
            .position(|a| a == "--database")
            .unwrap();
        h.catalog_args[at + 1].replace('_', "-")
    };
    let dynamo = aws_sdk_dynamodb::Client::new(&streamtable::aws::load_config().await);
    let legacy = |partition: i32, seq: u64| {
        let (dynamo, table) = (dynamo.clone(), table.clone());
        async move {
            dynamo
                .put_item()
                .table_name(table)
                .item("pk", AttributeValue::S(format!("state#orders#{partition}")))
                .item("sk", AttributeValue::S("state".into()))
                .item("next", AttributeValue::N("0".into()))
                .item("seq", AttributeValue::N(seq.to_string()))
                .item(
                    "location",
                    AttributeValue::S(format!("s3://elsewhere/state-{seq}.zst")),
                )
                .send()
                .await
                .expect("legacy state");
        }
    };
    // An advance that keeps the checkpoint and writes state `seq` (as the idle flush does).
    let advance = |store: DynamoStateStore, partition: i32, seq: u64| async move {
        let source = SourcePartition::new("orders", partition);
        let from = store.checkpoint(&source).await.expect("checkpoint");
        let state = StoredState {
            next_offset: from.next_offset,
            seq,
            body: None,
            location: Some(format!(
                "s3://b/warehouse/_state/partitions/orders/runs/{:032x}.run",
                u128::from(seq)
            )),
            bytes: 10,
            updated_at_ms: 1,
        };
        let batch = PendingBatch {
            source: source.clone(),
            first_offset: -(seq as i64),
            last_offset: -(seq as i64),
            more: Vec::new(),
            created_at_ms: 1,
            files: Vec::new(),
            files_location: None,
            delivery: Default::default(),
        };
        let a = SourceAdvance {
            source,
            from,
            to_next_offset: from.next_offset,
            newest_ms: -1,
            first_offset: -1,
            state: Some(state),
        };
        store.advance(&[a], &batch).await.expect("advance")
    };
    let read = |store: DynamoStateStore, partition: i32| async move {
        store
            .partition_states(&[SourcePartition::new("orders", partition)])
            .await
            .map(|mut v| v.pop().flatten())
    };
    let store = || DynamoStateStore::new(dynamo.clone(), table.clone());

    // The layout before at seq 3; an older release moves it to 4 after this release's read.
    legacy(3, 3).await;
    let s = store();
    assert_eq!(read(s.clone(), 3).await.unwrap().map(|s| s.seq), Some(3));
    legacy(3, 4).await;
    assert_eq!(advance(s.clone(), 3, 4).await, Advance::Conflict);
    // Re-planned from a fresh read: moved, and the old item is the marker.
    assert_eq!(read(s.clone(), 3).await.unwrap().map(|s| s.seq), Some(4));
    assert_eq!(advance(s.clone(), 3, 5).await, Advance::Advanced);
    assert_eq!(read(store(), 3).await.unwrap().map(|s| s.seq), Some(5));
    // The release before, from the state it read at 4: its put conditioned on seq 4 fails.
    let old = dynamo
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("state#orders#3".into()))
        .item("sk", AttributeValue::S("state".into()))
        .item("seq", AttributeValue::N("5".into()))
        .condition_expression("seq = :old")
        .expression_attribute_values(":old", AttributeValue::N("4".into()))
        .send()
        .await;
    assert!(old.is_err(), "the marker moved the old item's seq on");

    // Two stores see no state for partition 5; the first to write wins, the other conflicts.
    let (a, b) = (store(), store());
    assert_eq!(read(a.clone(), 5).await.unwrap(), None);
    assert_eq!(read(b.clone(), 5).await.unwrap(), None);
    assert_eq!(advance(a.clone(), 5, 1).await, Advance::Advanced);
    assert_eq!(advance(b.clone(), 5, 1).await, Advance::Conflict);
    // A zombie with a stale seq, after a newer write.
    assert_eq!(advance(a.clone(), 5, 2).await, Advance::Advanced);
    assert_eq!(advance(b.clone(), 5, 2).await, Advance::Conflict);

    // Half an entry: refused, naming the partition.
    let bucket_key = |pk: &str| {
        std::collections::HashMap::from([
            ("pk".to_string(), AttributeValue::S(pk.into())),
            ("sk".to_string(), AttributeValue::S("state".into())),
        ])
    };
    dynamo
        .update_item()
        .table_name(&table)
        .set_key(Some(bucket_key("state#orders#b000000")))
        .update_expression("REMOVE s5")
        .send()
        .await
        .expect("remove half an entry");
    let e = read(store(), 5)
        .await
        .expect_err("half an entry")
        .to_string();
    assert!(
        e.contains("state entry of orders-5") && e.contains("damaged"),
        "{e}"
    );
    // The bucket item deleted: the marker says where the state went.
    dynamo
        .delete_item()
        .table_name(&table)
        .set_key(Some(bucket_key("state#orders#b000000")))
        .send()
        .await
        .expect("delete the bucket");
    let e = read(store(), 3)
        .await
        .expect_err("moved, then lost")
        .to_string();
    assert!(e.contains("moved to its state bucket"), "{e}");
}

/// Ingest carries a window's partials in the state file only once the scheduled stage of a
/// release that reads carried rows has marked the state table, and stops again when that stage
/// runs with `STREAMTABLE_PENDING_BODIES=dictionary` (before a rollback): a commit stage of a
/// release before never meets carried rows.
#[tokio::test]
async fn partials_ride_in_state_files_only_once_the_commit_stage_reads_them() {
    use streamtable::store::StateStore;
    use streamtable::store::dynamodb::{BODY_LAYOUT, DynamoStateStore};

    let mut h = common::moto().await;
    h.spec = common::state_scenarios::orders_spec();
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let table = common::state_table(&h);
    let dynamo = aws_sdk_dynamodb::Client::new(&streamtable::aws::load_config().await);
    // The layout item as the release before writes it: dictionary bodies, no carried rows.
    common::put_layout_of_release_before(&dynamo, &table, Some(BODY_LAYOUT)).await;
    let fresh = || -> std::sync::Arc<dyn StateStore> {
        std::sync::Arc::new(DynamoStateStore::new(dynamo.clone(), table.clone()))
    };
    // Two minutes of orders per batch over 2 partitions: each closes windows.
    let batch = |i: i64| -> Vec<streamtable::generate::SourceRecord> {
        (0..2)
            .flat_map(|p| {
                (0..20).map(move |o| {
                    let offset = i * 20 + o;
                    let at = 1_796_170_835_019 + i * 120_000 + o * 6_000;
                    common::state_scenarios::order(p, offset, at, &format!("g-{p}-{offset}"))
                })
            })
            .collect()
    };
    let carried = |i: i64, state: std::sync::Arc<dyn StateStore>| {
        let e = common::event(&batch(i));
        let ingestor = h.ingestor_with_state(state);
        async move { ingestor.handle(&e).await.expect("ingest").files_carried }
    };
    assert_eq!(carried(0, fresh()).await, 0, "not before the upgrade");
    assert_eq!(carried(1, fresh()).await, 0, "not before the upgrade");
    fresh()
        .upgrade(streamtable::clock::now_ms())
        .await
        .expect("upgrade");
    let after = carried(2, fresh()).await;
    assert!(
        after >= 1,
        "the partials (and the dedup's small file) ride along: {after}"
    );
    std::sync::Arc::new(
        DynamoStateStore::new(dynamo.clone(), table.clone()).with_body_layout(BODY_LAYOUT),
    )
    .upgrade(streamtable::clock::now_ms())
    .await
    .expect("upgrade with STREAMTABLE_PENDING_BODIES=dictionary");
    assert_eq!(carried(3, fresh()).await, 0, "taken back");
    let report = streamtable::commit::commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    assert_eq!(report.batches, 4, "{report:?}");
    assert!(report.blocked.is_empty(), "{:?}", report.blocked);
}
