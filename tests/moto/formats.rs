//! Avro and Protobuf topics behind schema registries on the moto server: Confluent-framed records (registry
//! stand-in) and Glue-framed records, plain and zlib, whose schemas are in moto's Glue Schema
//! Registry.

use crate::common;
use crate::common::format_scenarios as s;

#[tokio::test]
async fn avro_records_of_both_registries_land_with_their_values_and_evolve() {
    let h = common::moto().await;
    let registry = format!("reg-{}", uuid::Uuid::new_v4().simple());
    s::avro_records_land_and_evolve(&h, Some(&registry)).await;
}

#[tokio::test]
async fn an_unreachable_registry_retries_the_batch() {
    let h = common::moto().await;
    s::an_unreachable_registry_retries_the_batch(&h).await;
}

#[tokio::test]
async fn protobuf_records_of_both_registries_land_with_their_values_and_evolve() {
    let h = common::moto().await;
    let registry = format!("reg-{}", uuid::Uuid::new_v4().simple());
    common::protobuf_scenarios::protobuf_records_land_and_evolve(&h, Some(&registry)).await;
}

#[tokio::test]
async fn a_failing_registry_retries_the_batch() {
    let h = common::moto().await;
    s::a_failing_registry_retries_the_batch(&h).await;
}

#[tokio::test]
async fn columns_from_the_glue_registry_follow_its_versions() {
    let h = common::moto().await;
    let registry = format!("reg-{}", uuid::Uuid::new_v4().simple());
    common::registry_columns_scenarios::columns_follow_the_registry(&h, Some(&registry)).await;
}
