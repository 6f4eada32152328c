//! Exactly-once ingest on the embedded backend (SQLite state, local warehouse).

use crate::common;
use crate::common::scenarios;

#[tokio::test]
async fn redelivered_batch_lands_once() {
    scenarios::redelivered_batch_lands_once(&common::embedded().await).await;
}

#[tokio::test]
async fn retry_overlapping_accepted_offsets_takes_only_new_ones() {
    scenarios::retry_overlapping_accepted_offsets_takes_only_new_ones(&common::embedded().await)
        .await;
}

#[tokio::test]
async fn gaps_in_offsets_are_normal() {
    scenarios::gaps_in_offsets_are_normal(&common::embedded().await).await;
}

#[tokio::test]
async fn crash_after_files_before_transaction_is_recovered_by_the_retry() {
    scenarios::crash_after_files_before_transaction_is_recovered_by_the_retry(
        &common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn crash_after_transaction_before_response_is_not_repeated() {
    scenarios::crash_after_transaction_before_response_is_not_repeated(&common::embedded().await)
        .await;
}

#[tokio::test]
async fn zombie_invocation_cannot_move_the_checkpoint_back() {
    scenarios::zombie_invocation_cannot_move_the_checkpoint_back(&common::embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_land_once() {
    scenarios::concurrent_duplicates_land_once(&common::embedded().await).await;
}

#[tokio::test]
async fn multi_partition_batches_checkpoint_each_partition() {
    scenarios::multi_partition_batches_checkpoint_each_partition(&common::embedded().await).await;
}

#[tokio::test]
async fn every_bad_record_kind_is_dead_lettered_once() {
    scenarios::every_bad_record_kind_is_dead_lettered_once(&mut common::embedded().await).await;
}

#[tokio::test]
async fn values_land_exactly() {
    scenarios::values_land_exactly(&common::embedded().await).await;
}

#[tokio::test]
async fn zombie_overlapping_some_partitions_lands_only_the_rest() {
    scenarios::zombie_overlapping_some_partitions_lands_only_the_rest(&common::embedded().await)
        .await;
}

#[tokio::test]
async fn wider_than_one_transaction_lands_in_groups() {
    scenarios::wider_than_one_transaction_lands_in_groups(&common::embedded().await).await;
}
