//! Avro and Protobuf topics behind a schema registry on the embedded backend (SQLite catalog, local files),
//! with the Confluent-compatible registry stand-in.

mod common;

use common::format_scenarios as s;

#[tokio::test]
async fn avro_records_land_with_their_values_and_evolve() {
    let h = common::embedded().await;
    s::avro_records_land_and_evolve(&h, None).await;
}

#[tokio::test]
async fn an_unreachable_registry_retries_the_batch() {
    let h = common::embedded().await;
    s::an_unreachable_registry_retries_the_batch(&h).await;
}

#[tokio::test]
async fn protobuf_records_land_with_their_values_and_evolve() {
    let h = common::embedded().await;
    common::protobuf_scenarios::protobuf_records_land_and_evolve(&h, None).await;
}

#[tokio::test]
async fn a_failing_registry_retries_the_batch() {
    let h = common::embedded().await;
    s::a_failing_registry_retries_the_batch(&h).await;
}
