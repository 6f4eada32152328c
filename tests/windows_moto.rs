//! Windows and dedup on S3, DynamoDB and Glue (the moto server) against a brute-force oracle:
//! the partition state rides in the DynamoDB transaction with the checkpoint (see
//! `common/window_scenarios.rs`).

mod common;

use common::window_scenarios::{steps, windows_equal_the_oracle};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]
    #[test]
    fn windows_and_dedup_equal_a_brute_force_oracle(seed in any::<u64>(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async { windows_equal_the_oracle(common::moto().await, seed, steps).await });
    }
}

#[tokio::test]
async fn idle_partitions_close_their_windows_at_the_topics_watermark() {
    common::idle_scenarios::idle_partitions_close_their_windows_at_the_topics_watermark(
        common::moto().await,
    )
    .await;
}
