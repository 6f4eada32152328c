//! Reliability on the embedded backend: inputs no reader can hold, lost answers, bounded runs,
//! isolation of failures. Checked through pyiceberg and DuckDB.

use crate::common;
use crate::common::reliability_layout_scenarios as layout;
use crate::common::reliability_scenarios as r;

#[tokio::test]
async fn values_readers_cannot_hold_are_dead_letters() {
    r::values_readers_cannot_hold_are_dead_letters(&common::embedded().await).await;
}

#[tokio::test]
async fn lost_swap_answers_are_recognised_as_commits() {
    r::lost_swap_answers_are_recognised_as_commits(
        &common::embedded().await,
        r::LoseAnswers::Wrapper,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_run_ends_under_steady_ingest() {
    r::a_scheduled_run_ends_under_steady_ingest(&common::embedded().await).await;
}

#[tokio::test]
async fn a_partition_over_the_budget_does_not_stop_compaction() {
    r::a_partition_over_the_budget_does_not_stop_compaction(&common::embedded().await).await;
}

#[tokio::test]
async fn batches_that_cannot_be_committed_do_not_block_the_others() {
    common::blocked_scenarios::batches_that_cannot_be_committed_do_not_block_the_others(
        &mut common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn partition_values_are_escaped_and_grouped_by_value() {
    layout::partition_values_are_escaped_and_grouped_by_value(&mut common::embedded().await).await;
}

#[tokio::test]
async fn a_batch_given_up_on_is_replayed_exactly_once() {
    layout::a_batch_given_up_on_is_replayed_exactly_once(&common::embedded().await).await;
}

#[tokio::test]
async fn wide_rows_make_row_groups_bounded_by_bytes() {
    layout::wide_rows_make_row_groups_bounded_by_bytes(&common::embedded().await).await;
}

#[tokio::test]
async fn commit_intents_stay_within_their_size() {
    layout::commit_intents_stay_within_their_size(&mut common::embedded().await).await;
}

#[tokio::test]
async fn a_held_committer_and_an_overlapping_one_land_each_commit_once() {
    common::commit_race_scenarios::a_held_committer_and_an_overlapping_one_land_each_commit_once(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn an_append_under_a_commit_id_the_table_has_is_refused_at_the_swap() {
    common::commit_race_scenarios::an_append_under_a_commit_id_the_table_has_is_refused_at_the_swap(common::embedded().await).await;
}

#[tokio::test]
async fn a_committer_waits_for_the_lease_and_gives_up_at_its_deadline() {
    common::commit_race_scenarios::a_committer_waits_for_the_lease_and_gives_up_at_its_deadline(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn the_audit_accounts_for_every_offset_and_names_each_fault() {
    let mut h = common::embedded().await;
    common::audit_scenarios::the_audit_accounts_for_every_offset_and_names_each_fault(&mut h).await;
}

#[tokio::test]
async fn a_recreated_topic_is_refused_until_the_partition_is_reset() {
    r::a_recreated_topic_is_refused_until_the_partition_is_reset(&common::embedded().await).await;
}

#[tokio::test]
async fn an_interval_join_whose_sql_explodes_fails_its_round_not_the_stage() {
    r::an_interval_join_whose_sql_explodes_fails_its_round_not_the_stage(
        &mut common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_replay_ahead_of_the_checkpoint_is_refused_naming_the_gap() {
    r::a_replay_ahead_of_the_checkpoint_is_refused_naming_the_gap(&common::embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_bounded_by_bytes_with_parallel_units_land_each_batch_once() {
    common::commit_race_scenarios::rounds_bounded_by_bytes_with_parallel_units_land_each_batch_once(
        common::embedded().await,
    )
    .await;
}
