//! The ingest Lambda: MSK event-source-mapping batches to Parquet micro-files, exactly once.
//!
//! Configuration comes from the environment (see `streamtable::config`). Clients are built once
//! at start; every invocation runs `Ingestor::handle`, the same code as `streamtable ingest`.
//! The function fails an invocation only when the batch could not be landed, so the event
//! source mapping retries it; bad records go to the `dead_letters` table instead.

use std::sync::Arc;
use std::time::Instant;

use lambda_runtime::{Error, LambdaEvent, service_fn};
use streamtable::config::{Backend, Config};
use streamtable::esm::EsmEvent;
use streamtable::ingest::{IngestSummary, Ingestor};
use streamtable::telemetry;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init_json_logs();
    let config = Config::from_env()?;
    let spec = config.load_pipeline()?;
    let backend = Backend::connect(&config.backend).await?;
    let ingestor = Arc::new(Ingestor::new(&spec, &backend)?);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<EsmEvent>| {
        let ingestor = ingestor.clone();
        async move { handle(&ingestor, event.payload).await }
    }))
    .await
}

async fn handle(ingestor: &Ingestor, event: EsmEvent) -> Result<IngestSummary, Error> {
    let started = Instant::now();
    match ingestor.handle(&event).await {
        Ok(summary) => {
            let now_ms = chrono_now_ms();
            println!(
                "{}",
                telemetry::ingest_metrics(&summary, now_ms, started.elapsed().as_secs_f64() * 1e3)
            );
            Ok(summary)
        }
        Err(e) => {
            tracing::error!(error = %e, retryable = e.is_retryable(), "batch not landed; the event source mapping will retry it");
            Err(e.into())
        }
    }
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
