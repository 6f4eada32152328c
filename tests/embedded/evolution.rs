//! Schema evolution on the embedded backend (SQLite catalog, local warehouse).

use crate::common;
use crate::common::evolution_scenarios as s;

#[tokio::test]
async fn a_changed_spec_evolves_the_table_and_old_rows_keep_their_values() {
    s::a_changed_spec_evolves_the_table_and_old_rows_keep_their_values(&common::embedded().await)
        .await;
}

#[tokio::test]
async fn a_refused_change_stops_only_its_table() {
    s::a_refused_change_stops_only_its_table(&common::embedded().await).await;
}

#[tokio::test]
async fn a_struct_lands_and_evolves_inside() {
    common::struct_scenarios::a_struct_lands_and_evolves_inside(&common::embedded().await).await;
}
