//! `streamtable run`: a local event source mapping. It polls every partition of the spec's
//! topics and hands the ingest handler ESM-shaped events ([`super::batch`]), one invocation at
//! a time (so never two in flight for a partition), retrying a failed batch whole until it
//! lands; it runs the scheduled stage on its interval.
//!
//! Where it starts: each partition at the pipeline's own checkpoint (exactly once whatever the
//! consumer group says), a partition without one at `--starting-position`. After each landed
//! batch it commits the consumer group's offsets, so that Kafka's tools
//! (`kafka-consumer-groups.sh --describe`) show the lag; the group's offsets are read only where
//! `--starting-position latest` kept its first position.
//! It reads with `isolation.level=read_committed`: aborted transactions and control records
//! never reach the handler, and offsets have gaps where they were.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

pub use super::args::{EventSourceKind, RunArgs, RunReport, StartingPosition};
use super::batch::{Batch, Batcher};
pub use super::handler::Handler;
use super::handler::land;
use super::progress::{Lags, Progress};
pub use super::stop::Stop;
use super::{esm_record, kafka_error};
use crate::backend::Backend;
use crate::checkpoint::SourcePartition;
use crate::error::{Error, Result};
use crate::ingest::IngestSummary;
use crate::scheduled::ScheduledOptions;
use crate::tables::TableSet;

mod discover;

/// One partition's end of log as librdkafka last reported it.
#[derive(Debug, Clone, Copy)]
struct End {
    /// The last stable offset (the end a read_committed consumer can reach); -1 unknown.
    stable: i64,
    /// The log's start offset; -1 unknown.
    start: i64,
    /// The high watermark: past the last stable offset while a transaction is open.
    high: i64,
    /// Where the consumer's application position was.
    app: i64,
    /// When this was reported.
    at: Instant,
}

/// The consumer's context: keeps the ends of the partitions from librdkafka's statistics.
#[derive(Default)]
struct Context {
    ends: Mutex<BTreeMap<(String, i32), End>>,
}

impl ClientContext for Context {
    fn stats(&self, statistics: Statistics) {
        let at = Instant::now();
        let Ok(mut ends) = self.ends.lock() else {
            return;
        };
        for (topic, t) in statistics.topics {
            for (partition, p) in t.partitions {
                if partition < 0 {
                    continue;
                }
                let stable = if p.ls_offset >= 0 {
                    p.ls_offset
                } else {
                    p.hi_offset
                };
                ends.insert(
                    (topic.clone(), partition),
                    End {
                        stable,
                        start: p.lo_offset,
                        high: p.hi_offset,
                        app: p.app_offset,
                        at,
                    },
                );
            }
        }
    }
}

impl ConsumerContext for Context {}

/// Per assigned partition: where it started, what was fetched and what landed.
#[derive(Debug, Clone, Copy)]
struct Position {
    /// One past the last record fetched (the start offset before any).
    fetched: i64,
    /// One past the last record landed (the checkpoint before any).
    landed: i64,
    /// The consumer group's offset last committed.
    committed: i64,
}

/// The local event source mapping.
pub struct LocalEsm {
    args: RunArgs,
    consumer: StreamConsumer<Context>,
    topics: Vec<String>,
    handler: Arc<dyn Handler>,
    backend: Backend,
    tables: Option<Arc<TableSet>>,
    scheduled: ScheduledOptions,
    positions: BTreeMap<(String, i32), Position>,
    /// Topics not found in the cluster yet (reported once).
    missing: std::collections::BTreeSet<String>,
    /// Whether the topics' partitions were read once: `--starting-position latest` applies to
    /// the partitions there were then; partitions and topics created later start at their
    /// beginning (nothing produced to them is skipped).
    discovered: bool,
    /// Topics whose partitions are paused (their buffer is full while a batch is in flight).
    paused: std::collections::BTreeSet<String>,
    stop: Stop,
    /// The embedded home's note of partitions local events fed, with the spec: such a
    /// partition moves to the cluster's log before it is read ([`crate::cli::local_events`]).
    local_events: Option<(
        crate::cli::local_events::LocalEvents,
        crate::spec::PipelineSpec,
    )>,
}

impl LocalEsm {
    /// A mapping of `topics` on `args`' cluster to `handler`; `tables` is what the scheduled
    /// stage commits (none: it never runs).
    pub fn new(
        args: RunArgs,
        topics: Vec<String>,
        handler: Arc<dyn Handler>,
        backend: Backend,
        tables: Option<Arc<TableSet>>,
        stop: Stop,
    ) -> Result<LocalEsm> {
        if topics.is_empty() {
            return Err(Error::Config(
                "no topic to read: the spec has no table (or give --topic)".into(),
            ));
        }
        args.shape()?;
        let mut config = args.connection.client_config()?;
        config
            .set("group.id", &args.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            // Every partition is assigned at an explicit position; a position outside the log
            // (records deleted before they landed, a topic deleted and created again) is an
            // error to stop on, never a silent jump.
            .set("auto.offset.reset", "error")
            .set("statistics.interval.ms", "1000")
            // Up to the 6 MB payload per partition and fetch, as the ESM's pollers fetch.
            .set("max.partition.fetch.bytes", "6291456")
            .set("fetch.max.bytes", "52428800");
        let consumer: StreamConsumer<Context> = config
            .create_with_context(Context::default())
            .map_err(|e| kafka_error("create the consumer", e))?;
        Ok(LocalEsm {
            scheduled: ScheduledOptions::from_env()?,
            args,
            consumer,
            topics,
            handler,
            backend,
            tables,
            positions: BTreeMap::new(),
            missing: Default::default(),
            discovered: false,
            paused: Default::default(),
            stop,
            local_events: None,
        })
    }

    /// Moves the partitions `notes` says local events fed (the embedded demo's, event files)
    /// to the cluster's logs before reading them; `spec` names their tables.
    pub fn with_local_events(
        mut self,
        notes: Option<crate::cli::local_events::LocalEvents>,
        spec: &crate::spec::PipelineSpec,
    ) -> LocalEsm {
        self.local_events = notes.map(|n| (n, spec.clone()));
        self
    }

    /// After a landed batch: the positions, and the consumer group's offsets.
    fn landed(&mut self, batch: &Batch) {
        let mut tpl = TopicPartitionList::new();
        for c in &batch.carried {
            if let Some(p) = self.positions.get_mut(&(c.topic.clone(), c.partition)) {
                p.landed = p.landed.max(c.next);
                p.committed = p.committed.max(c.next);
            }
            let _ = tpl.add_partition_offset(&c.topic, c.partition, Offset::Offset(c.next));
        }
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!(error = %e, "could not commit the consumer group's offsets");
        }
    }

    /// Per partition: its lag (records between where it resumes and the end a read_committed
    /// reader can reach), `None` when not known yet.
    fn lags(&self) -> Lags {
        let ends = self
            .consumer
            .context()
            .ends
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        self.positions
            .iter()
            .map(|(k, p)| {
                let lag = ends
                    .get(k)
                    .filter(|e| e.stable >= 0)
                    .map(|e| (e.stable - Self::resumes_at(p, e)).max(0));
                let open = ends
                    .get(k)
                    .filter(|e| e.stable >= 0)
                    .map_or(0, |e| (e.high - e.stable).max(0));
                (k.clone(), lag, open)
            })
            .collect()
    }

    /// Where a partition resumes: past its last landed record, and past the control records
    /// and aborted transactions after it (librdkafka's position) once everything fetched has
    /// landed.
    fn resumes_at(p: &Position, end: &End) -> i64 {
        if p.landed >= p.fetched {
            p.landed.max(end.app).max(0)
        } else {
            p.landed.max(0)
        }
    }

    /// With nothing waiting: moves the consumer group's offsets past control records and
    /// aborted transactions that follow the last landed record (as a Java consumer's position
    /// does), so that Kafka's tools show no lag for a caught-up partition.
    fn commit_positions(&mut self, mode: CommitMode) {
        let ends = match self.consumer.context().ends.lock() {
            Ok(e) => e.clone(),
            Err(_) => return,
        };
        let mut tpl = TopicPartitionList::new();
        for (k, p) in self.positions.iter_mut() {
            let Some(e) = ends.get(k) else { continue };
            let at = Self::resumes_at(p, e);
            if p.landed >= p.fetched && at > p.committed {
                p.committed = at;
                let _ = tpl.add_partition_offset(&k.0, k.1, Offset::Offset(at));
            }
        }
        if tpl.count() > 0
            && let Err(e) = self.consumer.commit(&tpl, mode)
        {
            tracing::warn!(error = %e, "could not commit the consumer group's offsets");
        }
    }

    /// Whether every partition was caught up in statistics reported after `since`.
    fn caught_up(&self, since: Instant) -> bool {
        let Ok(ends) = self.consumer.context().ends.lock() else {
            return false;
        };
        // A topic that does not exist has nothing to read.
        self.positions.iter().all(|(k, p)| {
            ends.get(k).is_some_and(|e| {
                e.at > since && e.stable >= 0 && p.fetched.max(e.app).max(e.start) >= e.stable
            })
        })
    }

    /// Pauses fetching for a topic whose buffer holds two batches while one is in flight, and
    /// resumes it once it drained: a topic whose batches fail holds back only itself.
    fn pace(&mut self, topic: &str, full: bool) {
        if full == self.paused.contains(topic) {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p) in self.positions.keys().filter(|(t, _)| t == topic) {
            tpl.add_partition(t, *p);
        }
        let done = if full {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        match done {
            Ok(()) if full => {
                self.paused.insert(topic.to_string());
            }
            Ok(()) => {
                self.paused.remove(topic);
            }
            Err(e) => tracing::warn!(error = %e, topic, "could not pause or resume fetching"),
        }
    }

    /// Runs until stopped (or idle, with `--until-idle`).
    pub async fn run(mut self) -> Result<RunReport> {
        let shape = self.args.shape()?;
        // One buffer and at most one invocation in flight per topic, as the template maps each
        // topic with its own event source mapping: a topic whose batches fail holds back only
        // itself.
        let mut batchers: BTreeMap<String, Batcher> = self
            .topics
            .iter()
            .map(|t| (t.clone(), Batcher::new(shape.clone())))
            .collect();
        let mut in_flight: BTreeMap<String, InFlight> = BTreeMap::new();
        // Per topic in flight: whether its batch has failed at least once (is being retried).
        let mut retrying: BTreeMap<String, Arc<AtomicBool>> = BTreeMap::new();
        let mut report = RunReport::default();
        let until_idle = match self.args.until_idle {
            Some(s) => Some(RunArgs::seconds("until-idle", s, 86_400.0)?),
            None => None,
        };
        let interval =
            RunArgs::seconds("schedule-interval", self.args.schedule_interval, 86_400.0)?;
        let progress = Progress::new();
        let started = Instant::now();
        let mut last_message = Instant::now();
        let mut last_discover: Option<Instant> = None;
        // When the topics' partitions were last read from the cluster.
        let mut last_read: Option<Instant> = None;
        let mut last_schedule = Instant::now();
        let mut last_positions: Option<Instant> = None;
        let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut scheduled: Option<tokio::task::JoinHandle<Result<Vec<String>>>> = None;
        loop {
            if self.stop.requested() {
                break;
            }
            let now = Instant::now();
            if last_discover.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(5)) {
                match self.discover().await {
                    Ok(()) => last_read = Some(Instant::now()),
                    Err(e) => {
                        if (last_discover.is_none() && !e.is_retryable())
                            || matches!(e, Error::Recreated { .. })
                        {
                            return Err(e);
                        }
                        // A script waiting for the end (--until-idle) is told, with the
                        // transient fault's exit code, when the cluster cannot be read at all.
                        if until_idle.is_some()
                            && last_read.is_none()
                            && started.elapsed() >= Duration::from_secs(15)
                        {
                            return Err(e);
                        }
                        tracing::warn!(error = %e, "could not read the topics' partitions");
                    }
                }
                last_discover = Some(now);
            }
            // Each topic's next invocation, when due and none of its own is in flight.
            for (topic, batcher) in batchers.iter_mut() {
                if !in_flight.contains_key(topic)
                    && batcher.due(now)
                    && let Some(batch) = batcher.take()
                {
                    let failing = Arc::new(AtomicBool::new(false));
                    retrying.insert(topic.clone(), failing.clone());
                    in_flight.insert(
                        topic.clone(),
                        tokio::spawn(land(
                            self.handler.clone(),
                            batch,
                            self.args.maximum_retry_attempts,
                            self.stop.clone(),
                            (failures.clone(), failing),
                        )),
                    );
                }
            }
            // Back-pressure with two batches buffered for a topic: while its batch in flight is
            // being retried, that topic alone is paused (the others go on); otherwise fetching
            // waits for the invocation (pausing would drop librdkafka's prefetched records).
            let mut blocked = false;
            let fill: Vec<(String, bool, bool)> = batchers
                .iter()
                .map(|(t, b)| {
                    let full =
                        b.len() >= 2 * shape.batch_size || b.bytes() >= 2 * shape.max_payload;
                    let failing = retrying.get(t).is_some_and(|r| r.load(Ordering::Relaxed));
                    (t.clone(), full, failing)
                })
                .collect();
            for (topic, full, failing) in fill {
                self.pace(&topic, full && failing);
                blocked |= full && !failing;
            }
            // The scheduled stage, on its interval, beside ingest (as its Lambda runs).
            if let Some(h) = &scheduled
                && h.is_finished()
                && let Some(h) = scheduled.take()
            {
                report.scheduled_runs += 1;
                match h.await {
                    Ok(Ok(lines)) => progress.lines("scheduled", &lines),
                    Ok(Err(e)) => eprintln!("scheduled stage failed: {e}"),
                    Err(e) => eprintln!("scheduled stage failed: {e}"),
                }
            }
            if scheduled.is_none()
                && !interval.is_zero()
                && now.duration_since(last_schedule) >= interval
                && let Some(tables) = &self.tables
            {
                scheduled = Some(tokio::spawn(scheduled_run(
                    self.backend.clone(),
                    tables.clone(),
                    self.scheduled.clone(),
                )));
                last_schedule = now;
            }
            let idle_now = in_flight.is_empty() && batchers.values().all(Batcher::is_empty);
            if let Some(idle) = until_idle
                && idle_now
                && now.duration_since(last_message) >= idle
                && last_read.is_some_and(|t| t > last_message.max(started))
                && self.caught_up(last_message.max(started))
            {
                break;
            }
            if last_positions.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(2)) {
                self.commit_positions(CommitMode::Async);
                last_positions = Some(now);
            }
            progress.tick(&report, &self.lags(), started);
            let wait = batchers
                .iter()
                .filter(|(t, _)| !in_flight.contains_key(*t))
                .filter_map(|(_, b)| b.deadline())
                .min()
                .map_or(Duration::from_millis(200), |d| {
                    d.saturating_duration_since(now)
                })
                .min(Duration::from_millis(200));
            let topics_in_flight: Vec<String> = in_flight.keys().cloned().collect();
            let landed = tokio::select! {
                biased;
                (done, i, _) = async {
                    if in_flight.is_empty() {
                        std::future::pending().await
                    } else {
                        futures::future::select_all(in_flight.values_mut()).await
                    }
                } => Some((topics_in_flight.get(i).cloned().unwrap_or_default(), done)),
                message = self.consumer.recv(), if !blocked => {
                    let mut error = None;
                    match message {
                        Ok(m) => {
                            fetched(&mut self.positions, &m, &mut batchers, &mut report);
                            // Whatever else librdkafka has queued, without waiting (an error
                            // among it is handled as the first would be).
                            for _ in 0..shape.batch_size {
                                match self.consumer.recv().now_or_never() {
                                    Some(Ok(m)) => {
                                        fetched(&mut self.positions, &m, &mut batchers, &mut report)
                                    }
                                    Some(Err(e)) => {
                                        error = Some(e);
                                        break;
                                    }
                                    None => break,
                                }
                            }
                            last_message = Instant::now();
                        }
                        Err(e) => error = Some(e),
                    }
                    match error {
                        Some(e) if e.rdkafka_error_code()
                            == Some(rdkafka::types::RDKafkaErrorCode::AutoOffsetReset) =>
                        {
                            if let Some(stop) = self.outside_the_log(&e) {
                                self.stop.stop();
                                drain(&mut in_flight, &mut self, &mut report).await;
                                return Err(stop);
                            }
                        }
                        Some(e) => {
                            tracing::warn!(error = %e, "kafka");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        None => {}
                    }
                    None
                }
                _ = tokio::time::sleep(wait) => None,
            };
            if let Some((topic, done)) = landed {
                in_flight.remove(&topic);
                retrying.remove(&topic);
                let (batch, result) = match done {
                    Ok(d) => d,
                    Err(e) => {
                        self.stop.stop();
                        drain(&mut in_flight, &mut self, &mut report).await;
                        return Err(Error::Internal(format!("invocation task: {e}")));
                    }
                };
                match result {
                    Ok(summary) => {
                        self.landed(&batch);
                        report.batches += 1;
                        report.ingest.add(&summary);
                    }
                    Err(e) => {
                        // The other topics' batches in flight land or stop at their next retry.
                        self.stop.stop();
                        drain(&mut in_flight, &mut self, &mut report).await;
                        return Err(e);
                    }
                }
            }
        }
        // Stopped: the batches in flight land (or fail) first.
        let failed = drain(&mut in_flight, &mut self, &mut report).await;
        if let Some(h) = scheduled.take() {
            report.scheduled_runs += 1;
            match h.await {
                Ok(Ok(lines)) => progress.lines("scheduled", &lines),
                Ok(Err(e)) => eprintln!("scheduled stage failed: {e}"),
                Err(e) => eprintln!("scheduled stage failed: {e}"),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        // Nothing buffered is lost by stopping: it was never landed, and the next run fetches
        // it again from the checkpoints.
        if until_idle.is_some()
            && !self.stop.requested()
            && let Some(tables) = &self.tables
        {
            let lines =
                scheduled_run(self.backend.clone(), tables.clone(), self.scheduled.clone()).await?;
            report.scheduled_runs += 1;
            progress.lines("scheduled", &lines);
        }
        // Synchronously: the consumer closes next.
        tokio::task::block_in_place(|| self.commit_positions(CommitMode::Sync));
        progress.finish(&report, &self.lags(), started);
        report.failed_invocations = failures.load(Ordering::Relaxed);
        report.next_offsets = self
            .positions
            .iter()
            .map(|(k, p)| (k.clone(), p.landed))
            .collect();
        Ok(report)
    }
}

/// An invocation in flight: its batch back, with whether it landed.
type InFlight = tokio::task::JoinHandle<(Batch, Result<IngestSummary>)>;

/// Waits for the invocations in flight and books those that landed; returns the first error.
async fn drain(
    in_flight: &mut BTreeMap<String, InFlight>,
    esm: &mut LocalEsm,
    report: &mut RunReport,
) -> Option<Error> {
    let mut first = None;
    for (_, h) in std::mem::take(in_flight) {
        match h.await {
            Ok((batch, Ok(summary))) => {
                esm.landed(&batch);
                report.batches += 1;
                report.ingest.add(&summary);
            }
            Ok((_, Err(e))) => {
                first.get_or_insert(e);
            }
            Err(e) => {
                first.get_or_insert(Error::Internal(format!("invocation task: {e}")));
            }
        }
    }
    first
}

/// A fetched record into the buffer.
fn fetched(
    positions: &mut BTreeMap<(String, i32), Position>,
    message: &rdkafka::message::BorrowedMessage<'_>,
    batchers: &mut BTreeMap<String, Batcher>,
    report: &mut RunReport,
) {
    let record = esm_record(message);
    let (topic, partition) = (message.topic(), message.partition());
    let Some(p) = positions.get_mut(&(topic.to_string(), partition)) else {
        // A partition no longer assigned (its topic went away): not ours to land.
        return;
    };
    p.fetched = p.fetched.max(record.offset.saturating_add(1));
    if let Some(batcher) = batchers.get_mut(topic) {
        batcher.push(topic, partition, record, Instant::now());
        report.fetched += 1;
    }
}

async fn scheduled_run(
    backend: Backend,
    tables: Arc<TableSet>,
    options: ScheduledOptions,
) -> Result<Vec<String>> {
    let report = crate::scheduled::run(&backend, &tables, &options).await?;
    Ok(report.lines())
}

/// The topics a spec reads, each once, in order.
pub fn spec_topics(spec: &crate::spec::PipelineSpec) -> Vec<String> {
    let mut topics: Vec<String> = Vec::new();
    for t in spec
        .tables
        .iter()
        .map(|t| &t.topic)
        .chain(spec.derived.iter().map(|d| &d.table.topic))
    {
        if !topics.contains(t) {
            topics.push(t.clone());
        }
    }
    topics
}
