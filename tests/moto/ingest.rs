//! Exactly-once ingest on AWS services emulated by the moto server (S3 + DynamoDB).

use crate::common;
use crate::common::scenarios;

#[tokio::test]
async fn redelivered_batch_lands_once() {
    scenarios::redelivered_batch_lands_once(&common::moto().await).await;
}

#[tokio::test]
async fn retry_overlapping_accepted_offsets_takes_only_new_ones() {
    scenarios::retry_overlapping_accepted_offsets_takes_only_new_ones(&common::moto().await).await;
}

#[tokio::test]
async fn gaps_in_offsets_are_normal() {
    scenarios::gaps_in_offsets_are_normal(&common::moto().await).await;
}

#[tokio::test]
async fn crash_after_files_before_transaction_is_recovered_by_the_retry() {
    scenarios::crash_after_files_before_transaction_is_recovered_by_the_retry(
        &common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn crash_after_transaction_before_response_is_not_repeated() {
    scenarios::crash_after_transaction_before_response_is_not_repeated(&common::moto().await).await;
}

#[tokio::test]
async fn zombie_invocation_cannot_move_the_checkpoint_back() {
    scenarios::zombie_invocation_cannot_move_the_checkpoint_back(&common::moto().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_land_once() {
    scenarios::concurrent_duplicates_land_once(&common::moto().await).await;
}

#[tokio::test]
async fn multi_partition_batches_checkpoint_each_partition() {
    scenarios::multi_partition_batches_checkpoint_each_partition(&common::moto().await).await;
}

#[tokio::test]
async fn every_bad_record_kind_is_dead_lettered_once() {
    scenarios::every_bad_record_kind_is_dead_lettered_once(&mut common::moto().await).await;
}

#[tokio::test]
async fn values_land_exactly() {
    scenarios::values_land_exactly(&common::moto().await).await;
}

#[tokio::test]
async fn zombie_overlapping_some_partitions_lands_only_the_rest() {
    scenarios::zombie_overlapping_some_partitions_lands_only_the_rest(&common::moto().await).await;
}

#[tokio::test]
async fn wider_than_one_transaction_lands_in_groups() {
    scenarios::wider_than_one_transaction_lands_in_groups(&common::moto().await).await;
}

/// Upgrading from per-partition checkpoints (before 0.3) to buckets loses and repeats nothing:
/// until the layout is synced the per-partition items stay the authority (an invocation of the
/// old release still in flight advances them); an hour after the upgrade they are copied into
/// the buckets, which are the authority from then on.
#[tokio::test]
async fn per_partition_checkpoints_upgrade_to_buckets_exactly_once() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use common::{event, keys, records};
    use streamtable::store::{DynamoStateStore, StateStore};

    let h = common::moto().await;
    let table = common::state_table(&h);
    let sdk = streamtable::aws::load_config().await;
    let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
    let legacy = |next: i64, version: i64| {
        let (dynamo, table) = (dynamo.clone(), table.clone());
        async move {
            dynamo
                .put_item()
                .table_name(table)
                .item("pk", AttributeValue::S("source#orders#0".into()))
                .item("sk", AttributeValue::S("checkpoint".into()))
                .item("next_offset", AttributeValue::N(next.to_string()))
                .item("version", AttributeValue::N(version.to_string()))
                .send()
                .await
                .expect("legacy checkpoint");
        }
    };
    let fresh = || -> std::sync::Arc<dyn StateStore> {
        std::sync::Arc::new(DynamoStateStore::new(dynamo.clone(), table.clone()))
    };
    // An earlier release landed 0..50.
    legacy(50, 3).await;

    // The new release before the scheduled stage ran: mirror mode.
    let s = h
        .ingestor_with_state(fresh())
        .handle(&event(&records("orders", 0, 0..80)))
        .await
        .expect("mirror ingest");
    assert_eq!((s.accepted, s.already_seen), (30, 50));
    let now = streamtable::clock::now_ms();
    fresh().upgrade(now).await.expect("upgrade");
    // Still within the hour: an old invocation in flight advances the per-partition item
    // (it landed 80..100), and the new release follows it.
    legacy(100, 5).await;
    let s = h
        .ingestor_with_state(fresh())
        .handle(&event(&records("orders", 0, 80..110)))
        .await
        .expect("mirror ingest after the old release");
    assert_eq!((s.accepted, s.already_seen), (10, 20));
    // An hour later: copied into the bucket, which is the authority from now on.
    fresh()
        .upgrade(now + 3_600_001)
        .await
        .expect("upgrade after the window");
    let store = fresh();
    let s = h
        .ingestor_with_state(store.clone())
        .handle(&event(&records("orders", 0, 100..130)))
        .await
        .expect("bucket ingest");
    assert_eq!((s.accepted, s.already_seen), (20, 10));
    assert_eq!(
        store
            .checkpoint(&streamtable::checkpoint::SourcePartition::new("orders", 0))
            .await
            .expect("checkpoint")
            .next_offset,
        130
    );
    let mut expected = keys(0, 50..80);
    expected.extend(keys(0, 100..130));
    assert_eq!(h.landed("orders").await, expected);
}

/// The pending items in state table `table`, as DynamoDB holds them.
async fn pending_items(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    dynamo
        .scan()
        .table_name(table)
        .filter_expression("begins_with(pk, :p)")
        .expression_attribute_values(
            ":p",
            aws_sdk_dynamodb::types::AttributeValue::S("pending#".into()),
        )
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default()
}

/// DynamoDB's billed size of an item: each attribute's name and value (a number at about a
/// byte per two digits), as its documentation counts them.
fn item_bytes(
    item: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
) -> usize {
    use aws_sdk_dynamodb::types::AttributeValue;
    item.iter()
        .map(|(name, v)| {
            name.len()
                + match v {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::N(n) => n.len().div_ceil(2) + 1,
                    AttributeValue::B(b) => b.as_ref().len(),
                    AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
                    other => format!("{other:?}").len(),
                }
        })
        .sum()
}

/// A pending batch's item is written in the batch's transaction (2 write units per KB) and
/// deleted by its commit (1 per KB): the shipped spec's orders batch — the files of orders,
/// `orders_clean` and the window's partials, with their column statistics — fits one kilobyte
/// over 4 partitions and over 64, whose other 63 offset ranges travel in it too (1.5 KB each,
/// 4 and 2 units, before its body was compressed against a dictionary).
#[tokio::test]
async fn a_pending_batch_item_of_the_shipped_spec_fits_its_kilobytes() {
    use common::event;
    for (width, most) in [(4, 1024), (64, 1024)] {
        let mut h = common::moto().await;
        h.spec = common::shipped_spec();
        h.tables().ensure_all(&h.backend).await.expect("tables");
        // As the scheduled stage does on a new deployment: nothing to move, buckets from now.
        h.backend
            .state
            .upgrade(streamtable::clock::now_ms())
            .await
            .expect("layout");
        // 10,000 orders of the last 100 s with random ids, round-robin over the partitions of a
        // topic that has run for a while.
        let now = streamtable::clock::now_ms();
        let mut f = streamtable::generate::EventFactory::new(7);
        let recs: Vec<_> = (0..10_000i64)
            .map(|i| {
                let at = now - 100_000 + i * 10;
                let id = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                streamtable::generate::SourceRecord {
                    topic: "orders".into(),
                    partition: (i % i64::from(width)) as i32,
                    offset: 1_000_000_000 + i / i64::from(width),
                    timestamp_ms: at,
                    key: Some(format!("{id:x}").into_bytes()),
                    value: Some(f.order(id, at).into_bytes()),
                    raw_value_field: None,
                }
            })
            .collect();
        h.ingestor().handle(&event(&recs)).await.expect("ingest");
        let sdk = streamtable::aws::load_config().await;
        let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
        let sizes: Vec<usize> = pending_items(&dynamo, &common::state_table(&h))
            .await
            .iter()
            .map(item_bytes)
            .collect();
        eprintln!("width {width}: pending items of {sizes:?} bytes");
        assert_eq!(sizes.len(), 1, "one pending item per invocation");
        assert!(
            sizes[0] <= most,
            "width {width}: {} bytes > {most}",
            sizes[0]
        );
    }
}

/// Pending bodies compressed against the dictionary are written only once the commit stage
/// reads them: on a table the release before laid out, ingest writes the first layout (which
/// that release's commit stage, still running during a rolling deploy, reads); once this
/// release's scheduled stage marked the layout, the dictionary one. Both commit.
#[tokio::test]
async fn dictionary_bodies_wait_for_a_commit_stage_that_reads_them() {
    use common::{event, keys, records};
    use streamtable::store::{DynamoStateStore, StateStore};

    let h = common::moto().await;
    h.tables().ensure_all(&h.backend).await.expect("tables");
    let table = common::state_table(&h);
    let dynamo = aws_sdk_dynamodb::Client::new(&streamtable::aws::load_config().await);
    // The layout item as the release before writes it.
    common::put_layout_of_release_before(&dynamo, &table, None).await;
    let fresh = || -> std::sync::Arc<dyn StateStore> {
        std::sync::Arc::new(DynamoStateStore::new(dynamo.clone(), table.clone()))
    };
    let first_bytes = || {
        let (dynamo, table) = (dynamo.clone(), table.clone());
        async move {
            let mut tags: Vec<u8> = pending_items(&dynamo, &table)
                .await
                .iter()
                .filter_map(|i| i.get("body")?.as_b().ok()?.as_ref().first().copied())
                .collect();
            tags.sort();
            tags
        }
    };
    h.ingestor_with_state(fresh())
        .handle(&event(&records("orders", 0, 0..10)))
        .await
        .expect("ingest");
    assert_eq!(first_bytes().await, [0x28], "the first layout");
    fresh()
        .upgrade(streamtable::clock::now_ms())
        .await
        .expect("the scheduled stage's upgrade");
    h.ingestor_with_state(fresh())
        .handle(&event(&records("orders", 0, 10..20)))
        .await
        .expect("ingest");
    assert_eq!(first_bytes().await, [0x01, 0x28], "then the dictionary's");
    assert_eq!(h.landed("orders").await, keys(0, 0..20), "both read back");
    let report = streamtable::commit::commit_pending(&h.backend, &h.tables())
        .await
        .expect("commit");
    assert_eq!(report.batches, 2, "{report:?}");
    assert_eq!(
        report.tables.iter().map(|t| t.rows).sum::<u64>(),
        20,
        "{report:?}"
    );
    assert!(first_bytes().await.is_empty(), "both committed");

    // Before a rollback: the scheduled stage set to `first` takes the dictionary back.
    std::sync::Arc::new(
        DynamoStateStore::new(dynamo.clone(), table.clone()).with_dictionary_bodies(false),
    )
    .upgrade(streamtable::clock::now_ms())
    .await
    .expect("upgrade with STREAMTABLE_PENDING_BODIES=first");
    h.ingestor_with_state(fresh())
        .handle(&event(&records("orders", 0, 20..30)))
        .await
        .expect("ingest");
    assert_eq!(first_bytes().await, [0x28], "the first layout again");
}

/// A pending item that cannot be read (damaged, or in a later release's layout after a
/// rollback) is not an absent one: orphan clean-up deletes nothing while it is there, so the
/// files it names — whose offsets the checkpoint has already passed — are not lost.
#[tokio::test]
async fn orphan_clean_up_waits_while_a_pending_item_cannot_be_read() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use common::{event, records};

    let h = common::moto().await;
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    h.backend
        .state
        .upgrade(streamtable::clock::now_ms())
        .await
        .expect("layout");
    h.ingestor()
        .handle(&event(&records("orders", 0, 0..10)))
        .await
        .expect("ingest");
    let files = h.pending_files().await;
    assert!(!files.is_empty());
    let paths: Vec<String> = files
        .iter()
        .map(|f| {
            let df: serde_json::Value = serde_json::from_str(&f.data_file).expect("json");
            df["file_path"].as_str().expect("path").to_string()
        })
        .collect();
    let dynamo = aws_sdk_dynamodb::Client::new(&streamtable::aws::load_config().await);
    let items = pending_items(&dynamo, &common::state_table(&h)).await;
    assert_eq!(items.len(), 1);
    let item = &items[0];
    dynamo
        .update_item()
        .table_name(common::state_table(&h))
        .key("pk", item["pk"].clone())
        .key("sk", item["sk"].clone())
        .update_expression("SET body = :b")
        .expression_attribute_values(
            ":b",
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(vec![0x07, 1, 2, 3])),
        )
        .send()
        .await
        .expect("a body of a layout no release knows");
    let aggressive = streamtable::maintenance::MaintenanceOptions {
        orphan_grace_ms: -60_000,
        ..Default::default()
    };
    let err = streamtable::maintenance::maintain_all(&h.backend, &tables, &aggressive)
        .await
        .expect_err("orphan clean-up refuses");
    assert!(err.to_string().contains("cannot be read"), "{err}");
    for p in &paths {
        assert!(
            h.backend.warehouse.stat(p).await.expect("stat").is_some(),
            "{p} was deleted"
        );
    }
}
