//! The Lambda handlers: what each function does around the stage it runs, written once.
//!
//! A function's `main` is one call ([`ingest::run`], [`scheduled::run`]): it sets up JSON logs,
//! reads the configuration from the environment, builds the clients once, and serves
//! invocations. Per invocation the handler times the stage, prints one CloudWatch Embedded
//! Metric Format line, and on failure logs the error with whether it is transient. Ingest fails
//! an invocation only when the batch could not be landed, so the event source mapping retries
//! it (bad records go to `dead_letters`, never into an error).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lambda_runtime::{LambdaEvent, service_fn};

use crate::backend::Backend;
use crate::clock::Clock;
use crate::config::Config;
use crate::telemetry;

/// The ingest function: MSK batches to Parquet micro-files, exactly once.
pub mod ingest {
    use super::*;
    use crate::esm::EsmEvent;
    use crate::ingest::{IngestSummary, LiveIngestor};

    /// Serves ingest invocations until the runtime stops.
    pub async fn run() -> Result<(), lambda_runtime::Error> {
        telemetry::init_json_logs("ingest");
        let config = Config::from_env()?;
        let backend = Backend::connect(&config.backend).await?;
        let clock = backend.clock.clone();
        // The spec is read (and resolved against the registry and the catalog) on the first
        // invocation rather than in init: a catalog or registry that cannot be reached then
        // fails that invocation, which the event source mapping retries, instead of the init
        // phase. It is read again when a registry table's writer schema gains fields.
        let ingestor = Arc::new(LiveIngestor::from_config(&config, backend));
        lambda_runtime::run(service_fn(move |event: LambdaEvent<EsmEvent>| {
            let (ingestor, clock) = (ingestor.clone(), clock.clone());
            let cold_start = telemetry::invocation_started();
            async move { handle(&ingestor, clock.as_ref(), &event.payload, cold_start).await }
        }))
        .await
    }

    /// Lands one batch; prints its metrics line (also when it could not be landed, with why
    /// in the log).
    pub async fn handle(
        ingestor: &LiveIngestor,
        clock: &dyn Clock,
        event: &EsmEvent,
        cold_start: bool,
    ) -> Result<IngestSummary, lambda_runtime::Error> {
        let started = Instant::now();
        match ingestor.handle(event).await {
            Ok(summary) => {
                let ms = started.elapsed().as_secs_f64() * 1e3;
                tracing::info!(
                    records = summary.records,
                    accepted = summary.accepted,
                    already_seen = summary.already_seen,
                    dead_lettered = summary.dead_lettered,
                    files = summary.files_written,
                    ms = ms.round() as u64,
                    "batch landed"
                );
                let now = clock.now_ms();
                println!(
                    "{}",
                    telemetry::ingest_metrics(&summary, now, ms, cold_start)
                );
                for line in telemetry::ingest_topic_metrics(event, now) {
                    println!("{line}");
                }
                Ok(summary)
            }
            Err(e) => {
                tracing::error!(error = %e, retryable = e.is_retryable(),
                    "batch not landed; the event source mapping will retry it");
                let now = clock.now_ms();
                println!(
                    "{}",
                    telemetry::failure_metrics("ingest", event.len(), cold_start, now)
                );
                if matches!(e, crate::error::Error::Recreated { .. }) {
                    println!(
                        "{}",
                        telemetry::emf_line(
                            "ingest",
                            now,
                            &[("RecreatedPartitions", 1.0, "Count")]
                        )
                    );
                }
                for line in telemetry::ingest_topic_metrics(event, now) {
                    println!("{line}");
                }
                Err(e.into())
            }
        }
    }
}

/// The scheduled function: commit, compaction and maintenance, once per schedule tick.
pub mod scheduled {
    use super::*;
    use crate::scheduled::{ScheduledOptions, ScheduledReport};
    use crate::tables::TableSet;

    /// Time kept back from the invocation's deadline for the report and the metrics.
    pub const MARGIN: Duration = Duration::from_secs(20);

    struct Stage {
        config: Config,
        backend: Backend,
        /// The tables as last read; re-read per invocation when some table takes its columns
        /// from the registry.
        tables: tokio::sync::Mutex<Arc<TableSet>>,
        follows_registry: bool,
        options: ScheduledOptions,
    }

    impl Stage {
        /// The tables for this invocation: a spec with registry tables is read again (a new
        /// version may have added columns), and when the registry cannot be reached the last
        /// tables serve (their columns never shrink, so committing with them is safe).
        async fn tables(&self) -> Arc<TableSet> {
            let mut tables = self.tables.lock().await;
            if self.follows_registry {
                let read = self.config.load_pipeline_resolved(&self.backend).await;
                match read.and_then(|spec| TableSet::new(&spec, &self.backend.namespace)) {
                    Ok(t) => *tables = Arc::new(t),
                    Err(e) => tracing::warn!(error = %e,
                        "spec not read from the registry; the tables as last read are used"),
                }
            }
            tables.clone()
        }
    }

    /// Serves scheduled invocations until the runtime stops. The event's content is not used.
    pub async fn run() -> Result<(), lambda_runtime::Error> {
        telemetry::init_json_logs("scheduled");
        let config = Config::from_env()?;
        let backend = Backend::connect(&config.backend).await?;
        let spec = config.load_pipeline_resolved(&backend).await?;
        let tables = TableSet::new(&spec, &backend.namespace)?;
        let options = ScheduledOptions::from_env()?;
        let stage = Arc::new(Stage {
            follows_registry: spec.tables.iter().any(|t| t.registry_subject.is_some()),
            config,
            backend,
            tables: tokio::sync::Mutex::new(Arc::new(tables)),
            options,
        });
        lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
            let stage = stage.clone();
            let cold_start = telemetry::invocation_started();
            async move {
                let left = time_left(event.context.deadline, stage.backend.clock.as_ref());
                let tables = stage.tables().await;
                if is_state_stream_event(&event.payload) {
                    let t =
                        handle_trigger(&stage.backend, &tables, &stage.options, left, cold_start)
                            .await?;
                    Ok::<_, lambda_runtime::Error>(serde_json::json!({
                        "triggered_commit": {
                            "files": t.report.as_ref().map_or(0, |r| r.files()),
                            "waited_ms": t.waited.as_millis() as u64,
                        }
                    }))
                } else {
                    let r =
                        handle(&stage.backend, &tables, &stage.options, left, cold_start).await?;
                    Ok(serde_json::to_value(r)?)
                }
            }
        }))
        .await
    }

    /// Whether `event` comes from the state table's stream (new pending batches) rather than
    /// the schedule.
    pub fn is_state_stream_event(event: &serde_json::Value) -> bool {
        event["Records"]
            .as_array()
            .and_then(|r| r.first())
            .is_some_and(|r| r["eventSource"] == "aws:dynamodb")
    }

    /// Commits what landed, at most once per the commit interval (see
    /// [`crate::commit::trigger`]); prints its metrics line.
    pub async fn handle_trigger(
        backend: &Backend,
        tables: &TableSet,
        options: &ScheduledOptions,
        left: Duration,
        cold_start: bool,
    ) -> Result<crate::commit::trigger::Triggered, lambda_runtime::Error> {
        let deadline = Instant::now() + left;
        let run = Box::pin(crate::commit::trigger::commit_when_due(
            backend,
            tables,
            &options.commit,
            deadline,
        ));
        match run.await {
            Ok(t) => {
                let (files, ms) = t
                    .report
                    .as_ref()
                    .map_or((0, 0.0), |r| (r.files(), r.duration_ms));
                let audit = t
                    .report
                    .as_ref()
                    .map(|r| r.audit.clone())
                    .unwrap_or_default();
                let joins: Vec<&crate::commit::JoinStats> = t
                    .report
                    .iter()
                    .flat_map(|r| r.tables.iter().filter_map(|t| t.join.as_ref()))
                    .collect();
                println!(
                    "{}",
                    telemetry::emf_line(
                        "commit-trigger",
                        backend.clock.now_ms(),
                        &[
                            ("FilesCommitted", files as f64, "Count"),
                            ("CommitLatencyMs", ms, "Milliseconds"),
                            (
                                "TriggerWaitMs",
                                t.waited.as_secs_f64() * 1e3,
                                "Milliseconds"
                            ),
                            ("ColdStart", f64::from(u8::from(cold_start)), "Count"),
                            (
                                "JoinRowsEvicted",
                                joins.iter().map(|j| j.evicted_rows).sum::<u64>() as f64,
                                "Count"
                            ),
                            (
                                "JoinRoundsDeferred",
                                joins.iter().filter(|j| j.deferred).count() as f64,
                                "Count"
                            ),
                            (
                                "JoinBacklogFilesLost",
                                joins.iter().map(|j| j.backlog_files_lost).sum::<u64>() as f64,
                                "Count"
                            ),
                            ("AuditedRecords", audit.delivered as f64, "Count"),
                            ("AuditMismatches", audit.mismatches() as f64, "Count"),
                            ("AuditMissingRecords", audit.missing as f64, "Count"),
                            ("AuditDuplicatedRecords", audit.duplicated as f64, "Count"),
                            ("AuditUnreadableFiles", audit.unreadable as f64, "Count"),
                            ("AuditSkippedRounds", audit.skipped_rounds as f64, "Count"),
                        ],
                    )
                );
                Ok(t)
            }
            Err(e) => {
                tracing::error!(error = %e, retryable = e.is_retryable(),
                    "triggered commit failed; the next trigger or the schedule commits");
                println!(
                    "{}",
                    telemetry::failure_metrics(
                        "commit-trigger",
                        0,
                        cold_start,
                        backend.clock.now_ms()
                    )
                );
                Err(e.into())
            }
        }
    }

    /// The time an invocation has, less [`MARGIN`], from its deadline (epoch milliseconds).
    pub fn time_left(deadline_ms: u64, clock: &dyn Clock) -> Duration {
        let now = u64::try_from(clock.now_ms()).unwrap_or(0);
        Duration::from_millis(deadline_ms.saturating_sub(now)).saturating_sub(MARGIN)
    }

    /// Runs the stage within `left`; prints its metrics line, or logs why it failed.
    pub async fn handle(
        backend: &Backend,
        tables: &TableSet,
        options: &ScheduledOptions,
        left: Duration,
        cold_start: bool,
    ) -> Result<ScheduledReport, lambda_runtime::Error> {
        // Boxed: the stage's future is deep, and the runtime nests it further.
        let run = Box::pin(crate::scheduled::run_until(
            backend,
            tables,
            options,
            Instant::now() + left,
        ));
        match run.await {
            Ok(report) => {
                let now = backend.clock.now_ms();
                println!("{}", telemetry::scheduled_metrics(&report, now, cold_start));
                for line in telemetry::scheduled_table_metrics("scheduled", &report, now) {
                    println!("{line}");
                }
                Ok(report)
            }
            Err(e) => {
                tracing::error!(error = %e, retryable = e.is_retryable(),
                    "scheduled run failed; the next run resumes it");
                println!(
                    "{}",
                    telemetry::failure_metrics("scheduled", 0, cold_start, backend.clock.now_ms())
                );
                Err(e.into())
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::clock::ManualClock;

        #[test]
        fn stream_events_trigger_a_commit_and_schedule_events_a_run() {
            let stream = serde_json::json!({"Records": [{"eventSource": "aws:dynamodb",
                "eventName": "INSERT", "dynamodb": {"Keys": {"pk": {"S": "pending#03"}}}}]});
            let schedule = serde_json::json!({"source": "aws.events",
                "detail-type": "Scheduled Event", "detail": {}});
            assert!(is_state_stream_event(&stream));
            assert!(!is_state_stream_event(&schedule));
            assert!(!is_state_stream_event(&serde_json::json!({"Records": []})));
        }

        #[test]
        fn the_run_keeps_a_margin_before_the_deadline() {
            let clock = ManualClock::new(1_000_000);
            assert_eq!(
                time_left(1_900_000, clock.as_ref()),
                Duration::from_secs(880)
            );
            assert_eq!(time_left(1_010_000, clock.as_ref()), Duration::ZERO);
            assert_eq!(time_left(0, clock.as_ref()), Duration::ZERO);
        }
    }
}
