//! What an invocation of `streamtable run` calls, and how a batch is invoked until it lands:
//! retried whole, with backoff, as an event source mapping retries it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::batch::Batch;
use super::stop::Stop;
use crate::error::{Error, Result};
use crate::esm::EsmEvent;
use crate::ingest::{IngestSummary, Ingestor, LiveIngestor};

/// What an invocation runs: the ingest handler, in this process or behind a Lambda runtime.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Lands one event; an error means it did not land and is retried whole.
    async fn handle(&self, event: &EsmEvent) -> Result<IngestSummary>;
}

#[async_trait]
impl Handler for LiveIngestor {
    async fn handle(&self, event: &EsmEvent) -> Result<IngestSummary> {
        LiveIngestor::handle(self, event).await
    }
}

#[async_trait]
impl Handler for Ingestor {
    async fn handle(&self, event: &EsmEvent) -> Result<IngestSummary> {
        Ingestor::handle(self, event).await
    }
}

/// Invokes `handler` with `batch` until it lands (or `limit` retries run out, or a stop is
/// asked for between attempts); counts failed invocations in `failures` and marks `failing` once one failed.
pub(super) async fn land(
    handler: Arc<dyn Handler>,
    batch: Batch,
    limit: i64,
    stop: Stop,
    (failures, failing): (Arc<std::sync::atomic::AtomicU64>, Arc<AtomicBool>),
) -> (Batch, Result<IngestSummary>) {
    let mut attempt: i64 = 0;
    loop {
        attempt += 1;
        if attempt > 1 && stop.requested() {
            let e =
                Error::Internal("stopped with a batch not landed: run again to retry it".into());
            return (batch, Err(e));
        }
        let e = match handler.handle(&batch.event).await {
            Ok(summary) => return (batch, Ok(summary)),
            Err(e) => e,
        };
        failures.fetch_add(1, Ordering::Relaxed);
        failing.store(true, Ordering::Relaxed);
        let partitions: Vec<String> = batch
            .carried
            .iter()
            .map(|c| format!("{}/{} {}..{}", c.topic, c.partition, c.first, c.next))
            .collect();
        let partitions = partitions.join(", ");
        // MaximumRetryAttempts does not count the first invocation.
        if limit >= 0 && attempt > limit {
            let e = Error::Internal(format!(
                "a batch ({partitions}) did not land after {attempt} invocations: {e}; \
                 nothing was skipped: run again to retry it"
            ));
            return (batch, Err(e));
        }
        if stop.requested() {
            let e = Error::Internal(format!(
                "stopped with a batch ({partitions}) not landed: {e}; run again to retry it"
            ));
            return (batch, Err(e));
        }
        let wait = Duration::from_millis((250u64 << attempt.min(7)).min(30_000));
        tracing::warn!(error = %e, retryable = e.is_retryable(), attempt, batch = %partitions,
            "batch not landed; retrying it whole in {} ms", wait.as_millis());
        eprintln!("batch {partitions} not landed (attempt {attempt}): {e}; retrying it whole");
        let until = Instant::now() + wait;
        while Instant::now() < until && !stop.requested() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
