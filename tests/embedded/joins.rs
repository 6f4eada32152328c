//! The interval join on the embedded backend against a brute-force oracle, for any history of
//! deliveries, re-deliveries, crashes and commit rounds (see `common/join_scenarios.rs`).

use crate::common;
use crate::common::join_scenarios::{join_equals_the_oracle, steps};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn the_interval_join_equals_a_brute_force_oracle(seed in any::<u64>(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async { join_equals_the_oracle(common::embedded().await, seed, steps).await });
    }
}

#[tokio::test]
async fn an_idle_partition_stops_holding_the_joins_watermark() {
    common::join_bound_scenarios::an_idle_partition_stops_holding_the_joins_watermark(
        common::embedded().await,
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_join_keeps_at_most_its_bound() {
    common::join_bound_scenarios::a_join_keeps_at_most_its_bound(common::embedded().await).await;
}

#[tokio::test]
async fn a_join_round_that_cannot_finish_is_deferred_and_the_others_go_on() {
    common::join_bound_scenarios::a_join_round_that_cannot_finish_is_deferred_and_the_others_go_on(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn late_rows_of_deferred_rounds_are_dead_lettered_once() {
    common::join_bound_scenarios::late_rows_of_deferred_rounds_are_dead_lettered_once(
        common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn an_outage_during_a_join_round_does_not_defer_it() {
    common::join_bound_scenarios::an_outage_during_a_join_round_does_not_defer_it(
        common::embedded().await,
    )
    .await;
}
