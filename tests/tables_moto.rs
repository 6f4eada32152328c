//! Commit, compaction and maintenance on AWS emulated by moto (Glue catalog with VersionId
//! checks, S3), read back through pyiceberg's GlueCatalog and DuckDB over S3.

mod common;

use common::table_scenarios as s;

#[tokio::test]
async fn committed_tables_read_back_through_pyiceberg_and_duckdb() {
    s::committed_tables_read_back_through_pyiceberg_and_duckdb(&common::moto().await).await;
}

#[tokio::test]
async fn tables_are_created_on_first_use() {
    s::tables_are_created_on_first_use(&common::moto().await).await;
}

#[tokio::test]
async fn commit_crash_before_bookkeeping_is_finished_without_duplicates() {
    s::commit_crash_before_bookkeeping_is_finished_without_duplicates(&common::moto().await).await;
}

#[tokio::test]
async fn commit_crash_between_tables_is_resumed() {
    s::commit_crash_between_tables_is_resumed(&common::moto().await).await;
}

#[tokio::test]
async fn compaction_replaces_small_files_in_one_snapshot() {
    s::compaction_replaces_small_files_in_one_snapshot(&common::moto().await).await;
}

#[tokio::test]
async fn maintenance_deletes_only_unreferenced_files() {
    s::maintenance_deletes_only_unreferenced_files(&common::moto().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commit_and_compaction_keep_every_row_once() {
    s::concurrent_commit_and_compaction_keep_every_row_once(&common::moto().await).await;
}
