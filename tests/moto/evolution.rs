//! Schema evolution on the moto server (Glue catalog, S3, DynamoDB).

use crate::common;
use crate::common::evolution_scenarios as s;

/// The Glue table's columns (name, type), as Athena and QuickSight list them.
async fn glue_columns(h: &common::Harness, table: &str) -> Vec<(String, String)> {
    let glue = aws_sdk_glue::Client::new(&streamtable::aws::load_config().await);
    let t = glue
        .get_table()
        .database_name(&h.backend.namespace)
        .name(table)
        .send()
        .await
        .expect("get table");
    t.table()
        .and_then(|t| t.storage_descriptor())
        .expect("storage descriptor")
        .columns()
        .iter()
        .map(|c| {
            (
                c.name().to_string(),
                c.r#type().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_changed_spec_evolves_the_table_and_old_rows_keep_their_values() {
    let h = common::moto().await;
    s::a_changed_spec_evolves_the_table_and_old_rows_keep_their_values(&h).await;
    // Glue's columns follow the evolved schema (what Athena and QuickSight list).
    let columns = glue_columns(&h, "orders").await;
    let business: Vec<(&str, &str)> = columns
        .iter()
        .take(6)
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        business,
        [
            ("order_id", "string"),
            ("qty", "bigint"),
            ("amount", "decimal(18,2)"),
            ("state", "string"),
            ("coupon", "string"),
            ("created_at", "timestamp"),
        ]
    );
    assert!(
        !columns
            .iter()
            .any(|(n, _)| n == "customer_id" || n == "status")
    );
}

#[tokio::test]
async fn a_refused_change_stops_only_its_table() {
    s::a_refused_change_stops_only_its_table(&common::moto().await).await;
}

#[tokio::test]
async fn a_struct_lands_and_evolves_inside() {
    let h = common::moto().await;
    common::struct_scenarios::a_struct_lands_and_evolves_inside(&h).await;
    // Glue declares the struct as Athena reads it.
    let columns = glue_columns(&h, "orders").await;
    let customer = columns
        .iter()
        .find(|(n, _)| n == "customer")
        .map(|(_, t)| t.as_str());
    assert_eq!(
        customer,
        Some("struct<id:string,tier:bigint,region:string>")
    );
}
