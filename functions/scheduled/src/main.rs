//! The scheduled Lambda (EventBridge schedule, reserved concurrency 1): commit pending
//! micro-files as Iceberg snapshots, compact small files, expire snapshots, remove orphans —
//! within the invocation's deadline. The event's content is not used; `events/schedule.json` is
//! a sample. Configuration: `streamtable_pipeline::config` and `streamtable_pipeline::scheduled::ScheduledOptions`.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    streamtable_pipeline::lambda::scheduled::run().await
}
