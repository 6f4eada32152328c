//! Reliability on S3 + DynamoDB + Glue (the moto server started by scripts/test), with Glue
//! answers lost the way a network loses them.

mod common;

use common::reliability_scenarios as r;

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
