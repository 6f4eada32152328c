//! The analyst's side on AWS emulated by moto: SQL over Glue + S3, time travel, dashboards,
//! Athena rules.

use crate::common;
use crate::common::analyst_scenarios as a;

#[tokio::test]
async fn query_agrees_with_pyiceberg_on_every_table() {
    a::query_agrees_with_pyiceberg_on_every_table(&common::moto().await).await;
}

#[tokio::test]
async fn time_travel_reads_earlier_snapshots() {
    a::time_travel_reads_earlier_snapshots(&common::moto().await).await;
}

#[tokio::test]
async fn queries_are_read_only_and_errors_point_at_the_mistake() {
    a::queries_are_read_only_and_errors_point_at_the_mistake(&common::moto().await).await;
}

#[tokio::test]
async fn dashboards_render_every_chart() {
    let mut h = common::moto().await;
    h.spec = common::shipped_spec();
    a::dashboards_render_every_chart(&h).await;
}

#[tokio::test]
async fn every_table_is_athena_compatible() {
    a::every_table_is_athena_compatible(&common::moto().await).await;
}
