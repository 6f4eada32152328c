//! The compaction Lambda, run on a schedule (EventBridge, reserved concurrency 1): commit
//! pending micro-files as Iceberg snapshots, compact small files, expire snapshots, remove
//! orphans. The event's content is not used; `events/schedule.json` is a sample.
//!
//! Configuration comes from the environment (see `streamtable::config` and
//! `streamtable::compact::CompactOptions::from_lookup`). Every step is idempotent: a failed run
//! is finished by the next one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use streamtable::compact::CompactOptions;
use streamtable::config::{Backend, Config};
use streamtable::scheduled::{self, ScheduledReport};
use streamtable::tables::TableSet;
use streamtable::telemetry;

struct Stage {
    backend: Backend,
    tables: TableSet,
    options: CompactOptions,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init_json_logs();
    let config = Config::from_env()?;
    let spec = config.load_pipeline()?;
    let backend = Backend::connect(&config.backend).await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    let options = CompactOptions::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))?;
    let stage = Arc::new(Stage {
        backend,
        tables,
        options,
    });
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let stage = stage.clone();
        async move { handle(&stage, event.context.deadline).await }
    }))
    .await
}

/// Time kept back from the invocation's deadline for the report and metrics.
const MARGIN: Duration = Duration::from_secs(20);

async fn handle(stage: &Stage, deadline_ms: u64) -> Result<ScheduledReport, Error> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms)).saturating_sub(MARGIN);
    // Boxed: the stage's future is deep, and the runtime nests it further.
    match Box::pin(scheduled::run_until(
        &stage.backend,
        &stage.tables,
        &stage.options,
        Instant::now() + left,
    ))
    .await
    {
        Ok(report) => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            println!("{}", telemetry::scheduled_metrics(&report, now_ms));
            Ok(report)
        }
        Err(e) => {
            tracing::error!(error = %e, retryable = e.is_retryable(), "scheduled run failed; the next run resumes it");
            Err(e.into())
        }
    }
}
