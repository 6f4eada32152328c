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
