//! Reliability on the embedded backend: inputs no reader can hold, lost answers, bounded runs,
//! isolation of failures. Checked through pyiceberg and DuckDB.

mod common;

use common::reliability_scenarios as r;

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
