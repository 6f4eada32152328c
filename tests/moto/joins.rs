//! The interval join on S3, DynamoDB and Glue (the moto server) against a brute-force oracle
//! (see `common/join_scenarios.rs`): its state moves with the join table's Glue commits.

use crate::common;
use crate::common::join_scenarios::{join_equals_the_oracle, steps};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]
    #[test]
    fn the_interval_join_equals_a_brute_force_oracle(seed in any::<u64>(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async { join_equals_the_oracle(common::moto().await, seed, steps).await });
    }
}

#[tokio::test]
async fn an_idle_partition_stops_holding_the_joins_watermark() {
    common::join_bound_scenarios::an_idle_partition_stops_holding_the_joins_watermark(
        common::moto().await,
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn a_join_keeps_at_most_its_bound() {
    common::join_bound_scenarios::a_join_keeps_at_most_its_bound(common::moto().await).await;
}

#[tokio::test]
async fn a_join_round_that_cannot_finish_is_deferred_and_the_others_go_on() {
    common::join_bound_scenarios::a_join_round_that_cannot_finish_is_deferred_and_the_others_go_on(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn late_rows_of_deferred_rounds_are_dead_lettered_once() {
    common::join_bound_scenarios::late_rows_of_deferred_rounds_are_dead_lettered_once(
        common::moto().await,
    )
    .await;
}

#[tokio::test]
async fn an_outage_during_a_join_round_does_not_defer_it() {
    common::join_bound_scenarios::an_outage_during_a_join_round_does_not_defer_it(
        common::moto().await,
    )
    .await;
}
