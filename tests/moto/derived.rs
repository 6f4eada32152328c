//! Derived tables on S3, DynamoDB and Glue (the moto server): the streamed result equals the
//! batch result for any history of deliveries, re-deliveries and crashes (see
//! `common/derived_scenarios.rs`).

use crate::common;
use crate::common::derived_scenarios::{step, streamed_equals_batch};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]
    #[test]
    fn derived_tables_equal_their_sql_run_as_a_batch_query(
        seed in any::<u64>(),
        steps in proptest::collection::vec(step(), 1..8),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async { streamed_equals_batch(common::moto().await, seed, steps).await });
    }
}
