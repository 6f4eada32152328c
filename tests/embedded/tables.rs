//! Commit, compaction and maintenance on the embedded backend (SQLite catalog, local
//! warehouse), read back through pyiceberg's SqlCatalog and DuckDB.

use crate::common;
use crate::common::compaction_scenarios as c;
use crate::common::table_scenarios as s;

#[tokio::test]
async fn committed_tables_read_back_through_pyiceberg_and_duckdb() {
    s::committed_tables_read_back_through_pyiceberg_and_duckdb(&common::embedded().await).await;
}

#[tokio::test]
async fn tables_are_created_on_first_use() {
    s::tables_are_created_on_first_use(&common::embedded().await).await;
}

#[tokio::test]
async fn commit_crash_before_bookkeeping_is_finished_without_duplicates() {
    s::commit_crash_before_bookkeeping_is_finished_without_duplicates(&common::embedded().await)
        .await;
}

#[tokio::test]
async fn commit_crash_between_tables_is_resumed() {
    s::commit_crash_between_tables_is_resumed(&common::embedded().await).await;
}

#[tokio::test]
async fn a_replace_whose_new_file_is_gone_commits_nothing() {
    c::a_replace_whose_new_file_is_gone_commits_nothing(&common::embedded().await).await;
}

#[tokio::test]
async fn compaction_replaces_small_files_in_one_snapshot() {
    c::compaction_replaces_small_files_in_one_snapshot(&common::embedded().await).await;
}

#[tokio::test]
async fn maintenance_deletes_only_unreferenced_files() {
    s::maintenance_deletes_only_unreferenced_files(&common::embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commit_and_compaction_keep_every_row_once() {
    c::concurrent_commit_and_compaction_keep_every_row_once(&common::embedded().await).await;
}

#[tokio::test]
async fn compaction_copies_large_row_groups_and_merges_small_ones() {
    c::compaction_copies_large_row_groups_and_merges_small_ones(&common::embedded().await).await;
}

#[tokio::test]
async fn triggered_commits_are_spaced_by_the_interval() {
    s::triggered_commits_are_spaced_by_the_interval(&common::embedded().await).await;
}

#[tokio::test]
async fn status_shows_checkpoints_landings_pending_batches_and_commits() {
    common::status_scenarios::status_shows_checkpoints_landings_pending_batches_and_commits(
        &common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn a_table_whose_catalog_entry_is_gone_is_registered_at_its_head() {
    common::register_scenarios::a_table_whose_catalog_entry_is_gone_is_registered_at_its_head(
        &common::embedded().await,
    )
    .await;
}

#[tokio::test]
async fn size_tiers_leave_a_compacted_file_until_newer_files_add_up_to_it() {
    c::size_tiers_leave_a_compacted_file_until_newer_files_add_up_to_it(&common::embedded().await)
        .await;
}

#[tokio::test]
async fn upserts_read_back_as_the_last_record_per_key() {
    let mut h = common::embedded().await;
    common::upsert_scenarios::upserts_read_back_as_the_last_record_per_key(&mut h).await;
}

#[tokio::test]
async fn a_derived_upsert_table_holds_the_last_row_per_key() {
    let mut h = common::embedded().await;
    common::upsert_scenarios::a_derived_upsert_table_holds_the_last_row_per_key(&mut h).await;
}

#[tokio::test]
async fn a_changed_primary_key_is_refused_until_the_spec_rekeys() {
    let mut h = common::embedded().await;
    common::upsert_scenarios::a_changed_primary_key_is_refused_until_the_spec_rekeys(&mut h).await;
}

#[tokio::test]
async fn debezium_changes_read_back_as_the_current_rows() {
    let mut h = common::embedded().await;
    common::debezium_scenarios::debezium_changes_read_back_as_the_current_rows(&mut h).await;
}

#[tokio::test]
async fn debezium_avro_changes_read_back_as_the_current_rows() {
    let mut h = common::embedded().await;
    common::debezium_scenarios::debezium_avro_changes_read_back_as_the_current_rows(&mut h).await;
}

#[tokio::test]
async fn the_audit_counts_every_record_of_an_upsert_table() {
    let mut h = common::embedded().await;
    common::upsert_scenarios::the_audit_counts_every_record_of_an_upsert_table(&mut h).await;
}

#[tokio::test]
async fn a_large_file_keeps_its_deletes_until_enough_of_its_rows_are_gone() {
    let mut h = common::embedded().await;
    common::upsert_scenarios::a_large_file_keeps_its_deletes_until_enough_of_its_rows_are_gone(
        &mut h,
    )
    .await;
}
