//! The interval join on S3, DynamoDB and Glue (the moto server) against a brute-force oracle
//! (see `common/join_scenarios.rs`): its state moves with the join table's Glue commits.

mod common;

use common::join_scenarios::{join_equals_the_oracle, steps};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]
    #[test]
    fn the_interval_join_equals_a_brute_force_oracle(seed in any::<u64>(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async { join_equals_the_oracle(common::moto().await, seed, steps).await });
    }
}
