//! The upsert oracle (`tests/common/upsert_oracle.rs`) on the embedded backend.

use crate::common;
use crate::common::upsert_oracle::{run, step};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn an_upsert_table_is_the_last_record_of_each_key_whatever_the_history(
        steps in proptest::collection::vec(step(), 1..16)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async { run(common::embedded().await, steps).await });
    }
}
