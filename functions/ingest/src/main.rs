//! The ingest Lambda: MSK event-source-mapping batches to Parquet micro-files, exactly once.
//! Configuration: `streamtable_pipeline::config` and `streamtable_pipeline::ingest::IngestOptions`. The function
//! fails an invocation only when the batch could not be landed, so the event source mapping
//! retries it; bad records go to the `dead_letters` table instead.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    streamtable_pipeline::lambda::ingest::run().await
}
