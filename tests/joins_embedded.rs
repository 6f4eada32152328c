//! The interval join on the embedded backend against a brute-force oracle, for any history of
//! deliveries, re-deliveries, crashes and commit rounds (see `common/join_scenarios.rs`).

mod common;

use common::join_scenarios::{join_equals_the_oracle, steps};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn the_interval_join_equals_a_brute_force_oracle(seed in any::<u64>(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async { join_equals_the_oracle(common::embedded().await, seed, steps).await });
    }
}
