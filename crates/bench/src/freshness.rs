//! `streamtable-bench freshness`: event → queryable latency over a steady stream, with commits
//! triggered by landed batches ([`crate::commit::trigger`]).
//!
//! A producer makes `rate` orders a second, stamped with the time they are made, and hands
//! them to ingest every `window_ms` (the ESM's batching window), over 4 partitions. After each
//! landed batch it triggers a commit, which waits for the commit interval as the Lambda does.
//! When a commit finishes, every record of the batches it took is queryable: its latency is
//! that moment minus its event time. Prints p50/p99/max and the commits made; on the embedded
//! backend, or on moto (`--moto`, with `AWS_ENDPOINT_URL` set).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::tempdir;
use crate::backend::{Backend, BackendConfig};
use crate::cli::synthetic_records;
use crate::clock::now_ms;
use crate::commit::CommitOptions;
use crate::commit::trigger::commit_when_due;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{EventFactory, esm_event};
use crate::tables::TableSet;
use streamtable::ingest::Ingestor;

const PARTITIONS: i32 = 4;

/// What the benchmark runs.
pub(super) struct FreshnessArgs {
    pub seconds: u64,
    pub rate: u64,
    pub window_ms: u64,
    pub interval_s: u64,
    pub moto: bool,
}

#[derive(Default)]
struct Tracker {
    /// Landed, not yet committed: (first partition, its first offset) → event times of its
    /// records.
    landed: BTreeMap<(i32, i64), Vec<i64>>,
    latencies_ms: Vec<i64>,
    commits: Vec<i64>,
    done: bool,
}

fn lock(t: &Mutex<Tracker>) -> Result<std::sync::MutexGuard<'_, Tracker>> {
    t.lock()
        .map_err(|_| Error::Internal("freshness tracker poisoned".into()))
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs the benchmark.
pub(super) async fn freshness(config: &Config, a: &FreshnessArgs) -> Result<()> {
    let mut spec = config.load_pipeline()?;
    spec.retain_tables(|t| t.topic == "orders");
    spec.derived.clear();
    let _home;
    let backend = if a.moto {
        let name = format!("fresh-{}-{}", std::process::id(), now_ms() % 100_000);
        super::cost::create_resources(&name).await?;
        Backend::connect(&BackendConfig::Aws {
            bucket: name.clone(),
            prefix: "warehouse".into(),
            state_table: name.clone(),
            glue_database: name.replace('-', "_"),
        })
        .await?
    } else {
        let home = tempdir("bench-freshness")?;
        _home = home.clone();
        Backend::connect(&BackendConfig::Embedded { home }).await?
    };
    backend.state.upgrade(backend.clock.now_ms()).await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    for name in tables.tables.keys() {
        tables.ensure(&backend, name).await?;
    }
    let ingestor = Ingestor::new(&spec, &backend)?;
    let options = CommitOptions {
        min_interval: Duration::from_secs(a.interval_s),
        ..CommitOptions::default()
    };
    println!(
        "{} backend: {} orders/s for {} s, handed to ingest every {} ms over {PARTITIONS} partitions; \
         a commit triggered after each landed batch, at most one per {} s",
        if a.moto { "moto (aws)" } else { "embedded" },
        a.rate,
        a.seconds,
        a.window_ms,
        a.interval_s
    );
    let tracker = Mutex::new(Tracker::default());
    let notify = Notify::new();

    let producer = async {
        let mut factory = EventFactory::new(11);
        let mut offsets = vec![0i64; PARTITIONS as usize];
        let per_batch = (a.rate * a.window_ms / 1000).max(1);
        let end = Instant::now() + Duration::from_secs(a.seconds);
        let mut batch_start = now_ms();
        let mut n = 0u64;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(a.window_ms)).await;
            let mut recs = synthetic_records(
                &mut factory,
                "orders",
                per_batch,
                &mut offsets,
                n * per_batch,
                0,
                batch_start,
            );
            // Event time: spread evenly over the window that just passed.
            let now = now_ms();
            let span = (now - batch_start).max(1);
            let times: Vec<i64> = (0..recs.len())
                .map(|i| batch_start + span * i as i64 / recs.len() as i64)
                .collect();
            for (r, t) in recs.iter_mut().zip(&times) {
                r.timestamp_ms = *t;
            }
            batch_start = now;
            n += 1;
            let event: crate::esm::EsmEvent = serde_json::from_str(&esm_event(&recs))
                .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
            // The pending batch is named after its first partition and that one's first offset.
            let first = recs
                .iter()
                .map(|r| (r.partition, r.offset))
                .min()
                .ok_or_else(|| Error::Internal("empty bench batch".into()))?;
            ingestor.handle(&event).await?;
            lock(&tracker)?.landed.insert(first, times);
            notify.notify_one();
        }
        lock(&tracker)?.done = true;
        notify.notify_one();
        Ok::<_, Error>(())
    };

    let committer = async {
        loop {
            notify.notified().await;
            loop {
                let far = Instant::now() + Duration::from_secs(600);
                let t = commit_when_due(&backend, &tables, &options, far).await?;
                let committed_at = now_ms();
                if t.report.as_ref().is_some_and(|r| r.files() > 0) {
                    let pending: BTreeSet<(i32, i64)> = backend
                        .state
                        .pending()
                        .await?
                        .iter()
                        .map(|b| (b.source.partition, b.first_offset))
                        .collect();
                    let mut tr = lock(&tracker)?;
                    let taken: Vec<(i32, i64)> = tr
                        .landed
                        .keys()
                        .copied()
                        .filter(|k| !pending.contains(k))
                        .collect();
                    for k in taken {
                        if let Some(times) = tr.landed.remove(&k) {
                            tr.latencies_ms
                                .extend(times.iter().map(|t| committed_at - t));
                        }
                    }
                    tr.commits.push(committed_at);
                }
                let tr = lock(&tracker)?;
                if tr.landed.is_empty() {
                    if tr.done {
                        return Ok::<_, Error>(());
                    }
                    break;
                }
            }
        }
    };
    let (p, c) = tokio::join!(producer, committer);
    p?;
    c?;

    let mut tr = lock(&tracker)?;
    tr.latencies_ms.sort_unstable();
    let gaps: Vec<i64> = tr.commits.windows(2).map(|w| w[1] - w[0]).collect();
    println!(
        "event → queryable over {} records: p50 {:.1} s, p99 {:.1} s, max {:.1} s; {} commits, least gap between commits {:.1} s",
        tr.latencies_ms.len(),
        percentile(&tr.latencies_ms, 0.5) as f64 / 1e3,
        percentile(&tr.latencies_ms, 0.99) as f64 / 1e3,
        tr.latencies_ms.last().copied().unwrap_or(0) as f64 / 1e3,
        tr.commits.len(),
        gaps.iter().min().copied().unwrap_or(0) as f64 / 1e3,
    );
    Ok(())
}
