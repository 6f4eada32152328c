//! Windows and dedup on the embedded backend against a brute-force oracle, for any history of
//! deliveries, re-deliveries, zombies and crashes (see `common/window_scenarios.rs`).

use crate::common;
use crate::common::window_scenarios::{steps, windows_equal_the_oracle};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn windows_and_dedup_equal_a_brute_force_oracle(seed in any::<u64>(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async { windows_equal_the_oracle(common::embedded().await, seed, steps).await });
    }
}

#[tokio::test]
async fn idle_partitions_close_their_windows_at_the_topics_watermark() {
    common::idle_scenarios::idle_partitions_close_their_windows_at_the_topics_watermark(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_changed_window_sql_is_carried_over_restarted_or_refused_never_a_panic() {
    common::spec_change_scenarios::a_changed_window_sql_is_carried_over_restarted_or_refused_never_a_panic(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn an_older_release_keeps_the_state_of_a_table_it_does_not_know() {
    common::spec_change_scenarios::an_older_release_keeps_the_state_of_a_table_it_does_not_know(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_record_from_year_9999_does_not_move_the_watermark() {
    common::event_time_scenarios::a_record_from_year_9999_does_not_move_the_watermark(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_record_without_a_kafka_timestamp_is_bounded_by_the_clock() {
    common::event_time_scenarios::a_record_without_a_kafka_timestamp_is_bounded_by_the_clock(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn an_idle_partition_moves_to_the_lowest_active_watermark() {
    common::event_time_scenarios::an_idle_partition_moves_to_the_lowest_active_watermark(
        common::embedded().await,
    )
    .await;
}

/// Spilled partition states that no state item names (a losing duplicate's, a crashed
/// invocation's) and join state objects no snapshot names are deleted by maintenance; the
/// named ones stay.
#[tokio::test]
async fn orphaned_state_objects_are_deleted_and_named_ones_kept() {
    let mut h = common::embedded().await;
    h.spec = common::shipped_spec();
    h.spec
        .retain_tables(|t| t.name == "orders" || t.name == "payments");
    let tables = h.tables();
    tables.ensure_all(&h.backend).await.expect("tables");
    let options = streamtable::ingest::IngestOptions {
        max_inline_state_bytes: 1,
        ..streamtable::ingest::IngestOptions::for_spec(&h.spec)
    };
    let ingestor = h.ingestor().with_options(options);
    ingestor
        .handle(&common::event(&common::records("orders", 0, 0..5)))
        .await
        .expect("ingest");
    let source = streamtable::checkpoint::SourcePartition::new("orders", 0);
    let named = h
        .backend
        .state
        .partition_states(&[source])
        .await
        .expect("state")[0]
        .clone()
        .and_then(|s| s.location)
        .expect("the state was spilled");
    let root = h.backend.warehouse.root();
    let orphans = [
        format!("{root}/_state/partitions/orders/0/00000000000000000001-0000000009-dead.state"),
        format!("{root}/_state/orders/0/00000000000000000001-0000000009.state"),
        format!("{root}/_state/join/order_payments/lost-left-0.parquet"),
    ];
    for o in &orphans {
        h.backend
            .warehouse
            .write(o, bytes::Bytes::from_static(b"orphan"))
            .await
            .expect("write");
    }
    streamtable::commit::commit_pending(&h.backend, &tables)
        .await
        .expect("commit");
    let options = streamtable::maintenance::MaintenanceOptions {
        orphan_grace_ms: -1,
        ..Default::default()
    };
    streamtable::maintenance::maintain_all(&h.backend, &tables, &options)
        .await
        .expect("maintenance");
    for o in &orphans {
        assert!(
            h.backend.warehouse.stat(o).await.expect("stat").is_none(),
            "{o} is an orphan"
        );
    }
    assert!(
        h.backend
            .warehouse
            .stat(&named)
            .await
            .expect("stat")
            .is_some(),
        "{named} is the partition's state"
    );
}

#[tokio::test]
async fn a_batch_writes_one_state_file_for_every_partition_it_touched() {
    common::state_scenarios::a_batch_writes_one_state_file_for_every_partition_it_touched(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_state_of_the_previous_layout_is_read_and_migrated() {
    common::state_scenarios::a_state_of_the_previous_layout_is_read_and_migrated(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_state_naming_a_run_elsewhere_is_refused() {
    common::state_scenarios::a_state_naming_a_run_elsewhere_is_refused(common::embedded().await)
        .await;
}

#[tokio::test]
async fn a_window_s_partials_ride_in_the_state_file_and_land_with_the_commit() {
    common::state_scenarios::a_window_s_partials_ride_in_the_state_file_and_land_with_the_commit(
        common::embedded().await,
        common::embedded().await,
    )
    .await;
}
