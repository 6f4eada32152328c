//! Windows and dedup on S3, DynamoDB and Glue (the moto server) against a brute-force oracle:
//! the partition state rides in the DynamoDB transaction with the checkpoint (see
//! `common/window_scenarios.rs`).

mod common;

use common::window_scenarios::{steps, windows_equal_the_oracle};
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
    let store = streamtable::state::DynamoStateStore::new(dynamo.clone(), table.clone());
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
        use streamtable::state::CheckpointStore;
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
    let refused = streamtable::process::state::PartitionState::decode(&body, "partition orders/70")
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
