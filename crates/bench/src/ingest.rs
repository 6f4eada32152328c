//! `streamtable-bench ingest`: one full ESM batch, in memory, end to end, and its peak RSS.

use std::path::Path;
use std::time::Instant;

use super::{median, peak_rss_kb, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::cli::{read_event, synthetic_records};
use crate::clock::now_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{EventFactory, esm_event};
use streamtable::ingest::Ingestor;

pub(super) fn orders_event(records: u64, partitions: i32, start_offset: i64) -> String {
    let mut factory = EventFactory::new(42);
    let mut offsets = vec![start_offset; partitions.max(1) as usize];
    let recs = synthetic_records(
        &mut factory,
        "orders",
        records,
        &mut offsets,
        0,
        0,
        now_ms() - 3_600_000,
    );
    esm_event(&recs)
}

/// [`orders_event`] as the demo streams them: an hour-long feed of event times out of order by
/// up to ±10 s, one record in 997 late, one in 211 re-sent by its producer (so the count is a
/// little above `records`); order ids continue across `start_offset`s.
pub(super) fn orders_stream_event(records: u64, partitions: i32, start_offset: i64) -> String {
    let mut factory = EventFactory::new(42);
    let mut offsets = vec![start_offset; partitions.max(1) as usize];
    let disorder = crate::cli::Disorder::demo();
    let first_id = start_offset.max(0) as u64 * partitions.max(1) as u64;
    // 100,000 orders an hour, as before the timeline ended at the clock.
    let timeline = crate::cli::Timeline::from(now_ms() - 3_600_000, 36_000);
    let recs = crate::cli::synthetic_stream(
        &mut factory,
        "orders",
        records,
        &mut offsets,
        first_id,
        0,
        &timeline,
        &disorder,
    );
    esm_event(&recs)
}

pub(super) async fn ingest(
    config: &Config,
    records: u64,
    partitions: i32,
    iterations: usize,
) -> Result<()> {
    let spec = crate::spine_spec(config)?;
    let event = orders_event(records, partitions, 0);
    let mb = event.len() as f64 / 1e6;
    println!("batch: {records} order records over {partitions} partitions, event JSON {mb:.2} MB");

    // 1. Event JSON to Parquet bytes in memory, single invocation, no I/O.
    let scratch = tempdir("bench-encode")?;
    let backend = Backend::connect(&BackendConfig::Embedded {
        home: scratch.clone(),
    })
    .await?;
    let ingestor = Ingestor::new(&spec, &backend)?;
    let (mut parse_ms, mut encode_ms, mut total_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut parquet_bytes = 0;
    for _ in 0..iterations {
        let t0 = Instant::now();
        let parsed: crate::esm::EsmEvent = serde_json::from_str(&event)
            .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
        let t1 = Instant::now();
        let (n, files) = ingestor.encode_event(&parsed).await?;
        let t2 = Instant::now();
        drop(parsed);
        if n != records {
            return Err(Error::Internal(format!(
                "bench encoded {n} of {records} records"
            )));
        }
        parquet_bytes = files.iter().map(|f| f.bytes.len()).sum::<usize>();
        parse_ms.push((t1 - t0).as_secs_f64() * 1e3);
        encode_ms.push((t2 - t1).as_secs_f64() * 1e3);
        total_ms.push((t2 - t0).as_secs_f64() * 1e3);
    }
    let t = median(total_ms);
    println!(
        "encode (event JSON -> Parquet in memory): median {t:.1} ms = {:.0} records/s, {:.0} MB/s of event JSON \
         (parse event {:.1} ms, decode+encode {:.1} ms; Parquet {:.2} MB)",
        records as f64 / (t / 1e3),
        mb / (t / 1e3),
        median(parse_ms),
        median(encode_ms),
        parquet_bytes as f64 / 1e6
    );

    // 2. End to end on the embedded backend: files written, checkpoint advanced.
    let home = tempdir("bench-e2e")?;
    let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
    let ingestor = Ingestor::new(&spec, &backend)?;
    let events: Vec<String> = (0..iterations)
        .map(|i| orders_event(records, partitions, i as i64 * records as i64))
        .collect();
    let mut e2e_ms = Vec::new();
    for ev in &events {
        let t0 = Instant::now();
        let parsed: crate::esm::EsmEvent =
            serde_json::from_str(ev).map_err(|e| Error::Internal(format!("bench event: {e}")))?;
        let summary = ingestor.handle(&parsed).await?;
        e2e_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if summary.accepted != records {
            return Err(Error::Internal(format!(
                "bench accepted {} of {records}",
                summary.accepted
            )));
        }
    }
    let t = median(e2e_ms);
    println!(
        "end to end, embedded backend (parse, decode, encode, write files, checkpoint): median {t:.1} ms = {:.0} records/s, {:.0} MB/s",
        records as f64 / (t / 1e3),
        mb / (t / 1e3)
    );

    // 3. Peak RSS of one whole invocation, in a fresh process.
    let file = home.join("event.json");
    std::fs::write(&file, &event).map_err(|e| Error::io("write", &file, e))?;
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("find executable", "streamtable-bench", e))?;
    let rss_home = home.join("rss");
    let out = std::process::Command::new(exe)
        .args(["ingest-once", "--event"])
        .arg(&file)
        .env("STREAMTABLE_HOME", &rss_home)
        .env("STREAMTABLE_BACKEND", "embedded")
        .output()
        .map_err(|e| Error::io("run", "streamtable-bench ingest-once", e))?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

pub(super) async fn ingest_once(config: &Config, event: &Path, json: bool) -> Result<()> {
    let spec = crate::spine_spec(config)?;
    let backend = Backend::connect(&config.backend).await?;
    let ingestor = Ingestor::new(&spec, &backend)?;
    let before = peak_rss_kb();
    let parsed = read_event(event)?;
    let summary = ingestor.handle(&parsed).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "rss_mb": peak_rss_kb() as f64 / 1024.0,
                "rss_before_mb": before as f64 / 1024.0,
                "accepted": summary.accepted,
            })
        );
        return Ok(());
    }
    println!(
        "peak RSS of one invocation (process start, read + parse event, ingest): {:.1} MB (before the event: {:.1} MB); {}",
        peak_rss_kb() as f64 / 1024.0,
        before as f64 / 1024.0,
        summary.line()
    );
    Ok(())
}
