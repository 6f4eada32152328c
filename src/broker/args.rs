//! What `streamtable run` is asked (`RunArgs`: the event source mapping's settings as flags)
//! and what it reports (`RunReport`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Connection;
use super::batch::{BatchShape, EventSource, MAX_PAYLOAD_BYTES};
use crate::error::{Error, Result};
use crate::ingest::IngestSummary;

/// `--starting-position`: where a partition without a checkpoint starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StartingPosition {
    /// The oldest record the broker keeps (`TRIM_HORIZON`).
    TrimHorizon,
    /// Only records produced from now on (`LATEST`).
    Latest,
}

/// `--event-source`: the shape of the events, as Lambda sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventSourceKind {
    /// Amazon MSK (`"eventSource": "aws:kafka"`, with `eventSourceArn`).
    Msk,
    /// A self-managed cluster (`"eventSource": "SelfManagedKafka"`).
    SelfManaged,
}

/// Arguments of `streamtable run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    /// The cluster.
    pub connection: Connection,
    /// Topics to read (default: every topic of the pipeline spec).
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// `BatchSize`: records per invocation at most (1 to 10,000; template.yaml's default).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,
    /// `MaximumBatchingWindowInSeconds`: how long records wait for a batch to fill (0 to 300;
    /// template.yaml's default is 10).
    #[arg(long, default_value_t = 10.0)]
    pub maximum_batching_window: f64,
    /// The events' shape: MSK (`aws:kafka`) or self-managed (`SelfManagedKafka`).
    #[arg(long, value_enum, default_value_t = EventSourceKind::SelfManaged)]
    pub event_source: EventSourceKind,
    /// Where a partition without a checkpoint starts.
    #[arg(long, value_enum, default_value_t = StartingPosition::TrimHorizon)]
    pub starting_position: StartingPosition,
    /// The consumer group whose offsets are committed after each landed batch (for Kafka's
    /// tools; read only where `--starting-position latest` kept its first position).
    #[arg(long, default_value = "streamtable")]
    pub group_id: String,
    /// Seconds between runs of the scheduled stage (commit, compaction, maintenance);
    /// template.yaml's ScheduleExpression is `rate(1 minute)`. 0: never.
    #[arg(long, default_value_t = 60.0)]
    pub schedule_interval: f64,
    /// Exit once every partition is caught up and nothing new arrived for this many seconds,
    /// after a last run of the scheduled stage (for scripts and tests).
    #[arg(long)]
    pub until_idle: Option<f64>,
    /// Invocations of one batch before giving up on it (-1: until it lands, as an event source
    /// mapping without MaximumRetryAttempts does). Giving up stops `run` with an error;
    /// nothing is skipped.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub maximum_retry_attempts: i64,
    /// When records were deleted (retention, a delete) before they landed, go on from the
    /// log's start instead of stopping: those records are lost to the tables.
    #[arg(long)]
    pub skip_deleted_records: bool,
    /// POST each event to this Lambda Invoke endpoint (e.g. `cargo lambda watch`'s
    /// http://127.0.0.1:9000/2015-03-31/functions/ingest/invocations) instead of calling the
    /// handler in this process, so the real bootstrap binary runs.
    #[arg(long, value_name = "URL")]
    pub invoke: Option<String>,
}

impl RunArgs {
    /// Defaults for `bootstrap` (for the demo and tests).
    pub fn new(bootstrap: &str) -> RunArgs {
        RunArgs {
            connection: Connection::plaintext(bootstrap),
            topics: Vec::new(),
            batch_size: 10_000,
            maximum_batching_window: 10.0,
            event_source: EventSourceKind::SelfManaged,
            starting_position: StartingPosition::TrimHorizon,
            group_id: "streamtable".into(),
            schedule_interval: 60.0,
            until_idle: None,
            maximum_retry_attempts: -1,
            skip_deleted_records: false,
            invoke: None,
        }
    }

    pub(super) fn seconds(name: &str, v: f64, max: f64) -> Result<Duration> {
        if !(0.0..=max).contains(&v) {
            return Err(Error::Config(format!(
                "--{name} {v}: give seconds from 0 to {max}"
            )));
        }
        Ok(Duration::from_secs_f64(v))
    }

    pub(super) fn shape(&self) -> Result<BatchShape> {
        Ok(BatchShape {
            batch_size: self.batch_size as usize,
            window: Self::seconds(
                "maximum-batching-window",
                self.maximum_batching_window,
                300.0,
            )?,
            max_payload: MAX_PAYLOAD_BYTES,
            source: match self.event_source {
                EventSourceKind::Msk => EventSource::Msk {
                    arn: "arn:aws:kafka:local:000000000000:cluster/streamtable-local/local".into(),
                },
                EventSourceKind::SelfManaged => EventSource::SelfManaged,
            },
            bootstrap_servers: self.connection.bootstrap_servers.clone(),
        })
    }
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct RunReport {
    /// Records fetched.
    pub fetched: u64,
    /// Invocations that landed.
    pub batches: u64,
    /// Invocations that failed (and were retried).
    pub failed_invocations: u64,
    /// The handlers' summaries, added up.
    pub ingest: IngestSummary,
    /// Per topic-partition, where it resumes.
    pub next_offsets: BTreeMap<(String, i32), i64>,
    /// Runs of the scheduled stage.
    pub scheduled_runs: u64,
}
