//! Derived tables on the embedded backend: the streamed result equals the batch result for any
//! history of deliveries, re-deliveries and crashes (see `common/derived_scenarios.rs`).

mod common;

use common::derived_scenarios::{step, streamed_equals_batch};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn derived_tables_equal_their_sql_run_as_a_batch_query(
        seed in any::<u64>(),
        steps in proptest::collection::vec(step(), 1..10),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async { streamed_equals_batch(common::embedded().await, seed, steps).await });
    }
}
