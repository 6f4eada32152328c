//! Reliability on S3 + DynamoDB + Glue (the moto server started by scripts/test), with Glue
//! answers lost the way a network loses them.

use crate::common;
use crate::common::reliability_layout_scenarios as layout;
use crate::common::reliability_scenarios as r;

#[tokio::test]
async fn values_readers_cannot_hold_are_dead_letters() {
    r::values_readers_cannot_hold_are_dead_letters(&common::moto().await).await;
}

#[tokio::test]
async fn lost_swap_answers_are_recognised_as_commits() {
    r::lost_swap_answers_are_recognised_as_commits(&common::moto().await, r::LoseAnswers::Glue)
        .await;
}

#[tokio::test]
async fn lost_create_answers_keep_the_new_table() {
    r::lost_create_answers_keep_the_new_table(&common::moto().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_run_ends_under_steady_ingest() {
    r::a_scheduled_run_ends_under_steady_ingest(&common::moto().await).await;
}

#[tokio::test]
async fn batches_that_cannot_be_committed_do_not_block_the_others() {
    common::blocked_scenarios::batches_that_cannot_be_committed_do_not_block_the_others(
        &mut common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn partition_values_are_escaped_and_grouped_by_value() {
    layout::partition_values_are_escaped_and_grouped_by_value(&mut common::moto().await).await;
}

#[tokio::test]
async fn a_batch_given_up_on_is_replayed_exactly_once() {
    layout::a_batch_given_up_on_is_replayed_exactly_once(&common::moto().await).await;
}

#[tokio::test]
async fn commit_intents_stay_within_their_size() {
    layout::commit_intents_stay_within_their_size(&mut common::moto().await).await;
}

#[tokio::test]
async fn a_held_committer_and_an_overlapping_one_land_each_commit_once() {
    common::commit_race_scenarios::a_held_committer_and_an_overlapping_one_land_each_commit_once(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn an_append_under_a_commit_id_the_table_has_is_refused_at_the_swap() {
    common::commit_race_scenarios::an_append_under_a_commit_id_the_table_has_is_refused_at_the_swap(common::moto().await).await;
}

#[tokio::test]
async fn a_committer_waits_for_the_lease_and_gives_up_at_its_deadline() {
    common::commit_race_scenarios::a_committer_waits_for_the_lease_and_gives_up_at_its_deadline(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn the_audit_accounts_for_every_offset_and_names_each_fault() {
    let mut h = common::moto().await;
    common::audit_scenarios::the_audit_accounts_for_every_offset_and_names_each_fault(&mut h).await;
}

#[tokio::test]
async fn a_recreated_topic_is_refused_until_the_partition_is_reset() {
    r::a_recreated_topic_is_refused_until_the_partition_is_reset(&common::moto().await).await;
}

#[tokio::test]
async fn a_replay_ahead_of_the_checkpoint_is_refused_naming_the_gap() {
    r::a_replay_ahead_of_the_checkpoint_is_refused_naming_the_gap(&common::moto().await).await;
}

#[tokio::test]
async fn rounds_bounded_by_bytes_with_parallel_units_land_each_batch_once() {
    common::commit_race_scenarios::rounds_bounded_by_bytes_with_parallel_units_land_each_batch_once(
        common::moto().await,
    )
    .await;
}
