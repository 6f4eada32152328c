//! `streamtable-bench kafka`: a real broker to committed tables (`streamtable run`'s path)
//! next to `streamtable ingest` of the same records from event files, and how long the lag
//! takes to return to zero after a steady producer stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tempdir;
use crate::backend::{Backend, BackendConfig};
use crate::checkpoint::SourcePartition;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{SourceRecord, esm_event};
use crate::tables::TableSet;
use streamtable::broker::source::{LocalEsm, RunArgs, Stop};
use streamtable::broker::{Connection, produce};
use streamtable::ingest::Ingestor;

/// Knobs of the benchmark.
pub(super) struct KafkaBenchArgs {
    pub bootstrap: String,
    pub records: u64,
    pub partitions: i32,
    pub batch_size: u32,
    pub rate: u64,
    pub seconds: u64,
}

struct Setup {
    backend: Backend,
    ingestor: Arc<Ingestor>,
    tables: Arc<TableSet>,
}

/// A fresh embedded home with the orders table reading `topic`.
async fn setup(config: &Config, topic: &str, name: &str) -> Result<Setup> {
    let mut spec = crate::spine_spec(config)?;
    spec.tables.retain(|t| t.name == "orders");
    for t in &mut spec.tables {
        t.topic = topic.to_string();
    }
    let backend = Backend::connect(&BackendConfig::Embedded {
        home: tempdir(name)?,
    })
    .await?;
    let tables = Arc::new(TableSet::new(&spec, &backend.namespace)?);
    let ingestor = Arc::new(Ingestor::connect(&spec, &backend).await?);
    Ok(Setup {
        backend,
        ingestor,
        tables,
    })
}

fn bytes_of(records: &[SourceRecord]) -> u64 {
    records
        .iter()
        .map(|r| (r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len)) as u64)
        .sum()
}

async fn commit(s: &Setup) -> Result<()> {
    crate::scheduled::run(
        &s.backend,
        &s.tables,
        &crate::scheduled::ScheduledOptions::default(),
    )
    .await?;
    Ok(())
}

/// Runs the benchmark.
pub(super) async fn kafka(config: &Config, args: &KafkaBenchArgs) -> Result<()> {
    let connection = Connection::plaintext(&args.bootstrap);
    let stamp = crate::clock::now_ms();
    let topic = format!("bench-orders-{stamp}");
    let partitions = produce::ensure_topic(&connection, &topic, args.partitions).await?;
    let timeline = crate::cli::Timeline::ending(stamp, 0, args.records, 3_600_000, None);
    let records = produce::demo_records(&topic, args.records, partitions, 0, 0, &timeline);
    let n = records.len() as u64;
    let mb = bytes_of(&records) as f64 / 1e6;
    println!(
        "{n} order records ({mb:.1} MB of keys and values) over {partitions} partitions, \
         batches of at most {}",
        args.batch_size
    );

    // 1. The file path: ESM event files (as the ESM would cut the stream: up to the batch
    //    size, per partition in offset order), read, parsed and landed, then committed.
    let files = setup(config, &topic, "bench-kafka-files").await?;
    let dir = tempdir("bench-kafka-events")?;
    let mut by_partition: Vec<Vec<SourceRecord>> = vec![Vec::new(); partitions.max(1) as usize];
    for r in &records {
        if let Some(v) = by_partition.get_mut(r.partition as usize) {
            let mut r = r.clone();
            r.offset = v.len() as i64;
            v.push(r);
        }
    }
    let mut paths = Vec::new();
    let mut batch: Vec<SourceRecord> = Vec::new();
    let mut flush = |batch: &mut Vec<SourceRecord>| -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let path = dir.join(format!("event-{}.json", paths.len()));
        std::fs::write(&path, esm_event(batch))
            .map_err(|e| Error::io("write bench event", &path, e))?;
        paths.push(path);
        batch.clear();
        Ok(())
    };
    for r in by_partition.iter().flatten() {
        batch.push(r.clone());
        if batch.len() >= args.batch_size as usize {
            flush(&mut batch)?;
        }
    }
    flush(&mut batch)?;
    let t0 = Instant::now();
    for path in &paths {
        let event = streamtable::cli::read_event(path)?;
        files.ingestor.handle(&event).await?;
    }
    let ingest_s = t0.elapsed().as_secs_f64();
    commit(&files).await?;
    let file_s = t0.elapsed().as_secs_f64();
    println!(
        "files  ({} event files): {file_s:.2} s = {:.0} records/s, {:.1} MB/s (ingest {ingest_s:.2} s, commit {:.2} s)",
        paths.len(),
        n as f64 / file_s,
        mb / file_s,
        file_s - ingest_s
    );

    // 2. The broker path: the same records produced (untimed), then `streamtable run` from
    //    the beginning until caught up, then the same commit.
    produce::send(&connection, "lz4", records, 0, |_| {}).await?;
    let broker = setup(config, &topic, "bench-kafka-broker").await?;
    let mut run = RunArgs::new(&args.bootstrap);
    run.batch_size = args.batch_size;
    run.maximum_batching_window = 0.5;
    let idle = 0.5;
    run.until_idle = Some(idle);
    run.schedule_interval = 0.0;
    run.group_id = format!("bench-{stamp}");
    let esm = LocalEsm::new(
        run,
        vec![topic.clone()],
        broker.ingestor.clone(),
        broker.backend.clone(),
        None,
        Stop::default(),
    )?;
    let t0 = Instant::now();
    let report = esm.run().await?;
    // The run ends `idle` seconds after the last record arrived and once statistics confirm
    // it caught up (up to a second later): that wait is not work.
    let read_s = (t0.elapsed().as_secs_f64() - idle).max(1e-3);
    let t1 = Instant::now();
    commit(&broker).await?;
    let broker_s = read_s + t1.elapsed().as_secs_f64();
    if report.ingest.records != n {
        return Err(Error::Internal(format!(
            "the broker path landed {} records of {n}",
            report.ingest.records
        )));
    }
    println!(
        "broker ({} invocations): {broker_s:.2} s = {:.0} records/s, {:.1} MB/s (fetch and ingest {read_s:.2} s incl. up to 1 s of statistics delay, commit {:.2} s)",
        report.batches,
        n as f64 / broker_s,
        mb / broker_s,
        broker_s - read_s
    );
    println!(
        "broker / files: {:.0}% of the file path's throughput (target >= 60%)",
        100.0 * file_s / broker_s
    );

    // 3. Lag: a producer at `rate` records/s for `seconds`, `run` reading alongside; how long
    //    after the producer's last record every partition's checkpoint reaches the end.
    let topic = format!("bench-lag-{stamp}");
    let partitions = produce::ensure_topic(&connection, &topic, args.partitions).await?;
    let lag = setup(config, &topic, "bench-kafka-lag").await?;
    let mut run = RunArgs::new(&args.bootstrap);
    run.batch_size = args.batch_size;
    run.maximum_batching_window = 0.5;
    run.schedule_interval = 0.0;
    run.group_id = format!("bench-lag-{stamp}");
    let stop = Stop::default();
    let esm = LocalEsm::new(
        run,
        vec![topic.clone()],
        lag.ingestor.clone(),
        lag.backend.clone(),
        None,
        stop.clone(),
    )?;
    let task = tokio::spawn(esm.run());
    let steady_count = args.rate * args.seconds;
    let timeline =
        produce::produce_timeline(crate::clock::now_ms(), 0, steady_count, args.rate, None);
    let steady = produce::demo_records(&topic, steady_count, partitions, 0, 0, &timeline);
    let sent = produce::send(&connection, "lz4", steady, args.rate, |_| {}).await?;
    let stopped = Instant::now();
    let (_, end) = produce::watermarks(&connection, &topic)?;
    let sources: Vec<SourcePartition> = (0..partitions)
        .map(|p| SourcePartition::new(&topic, p))
        .collect();
    let caught_up = loop {
        let landed: i64 = lag
            .backend
            .state
            .checkpoints(&sources)
            .await?
            .iter()
            .map(|c| c.next_offset)
            .sum();
        if landed >= end {
            break stopped.elapsed().as_secs_f64();
        }
        if stopped.elapsed() > Duration::from_secs(120) {
            stop.stop();
            return Err(Error::Internal(format!(
                "lag not back to zero 120 s after the producer stopped ({landed} of {end})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.stop();
    let _ = task.await;
    println!(
        "lag: {sent} records at {} records/s for {} s; every partition caught up {caught_up:.2} s after the producer stopped (target <= 10 s; batching window 0.5 s)",
        args.rate, args.seconds
    );
    Ok(())
}
