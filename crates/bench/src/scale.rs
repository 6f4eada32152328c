//! `streamtable-bench scale`: what one `streamtable scheduled` does with a backlog. For each
//! backlog size, a fresh embedded home gets that many ESM batches of each of the shipped spec's
//! order topics (orders, payments, order_status: every derived table over them runs in ingest,
//! the interval join and the upsert table in the scheduled stage), then ONE scheduled run in a
//! fresh process prints its wall time, CPU, peak RSS and what it did, step by step.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{cpu_seconds, peak_rss_kb, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::clock::now_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::{EventFactory, esm_event};
use crate::tables::TableSet;
use streamtable::ingest::Ingestor;

/// The topics of a backlog, in the shipped spec.
const TOPICS: [&str; 3] = ["orders", "payments", "order_status"];

/// What one scheduled run printed (the child's JSON line).
#[derive(Debug, Serialize, Deserialize)]
struct Run {
    wall_s: f64,
    cpu_s: f64,
    rss_mb: f64,
    rows: u64,
    files: u64,
    batches: u64,
    rounds: u64,
    commit_s: f64,
    compaction_s: f64,
    partitions_compacted: u64,
    backlog_left: u64,
    failures: Vec<String>,
    threads: usize,
    units: u64,
    unit_busy_s: f64,
}

/// `streamtable-bench scale`.
pub(super) async fn scale(
    config: &Config,
    backlogs: &[u64],
    records: u64,
    partitions: i32,
    keep: bool,
) -> Result<()> {
    let spec = config.load_pipeline()?;
    println!(
        "scale: per topic of {TOPICS:?}, N ESM batches of {records} records over {partitions} partitions, \
         then one `streamtable scheduled` in a fresh process ({} cores here)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for &n in backlogs {
        let home = tempdir(&format!("bench-scale-{n}"))?;
        let started = Instant::now();
        let json_bytes = prepare(&spec, &home, n, records, partitions).await?;
        eprintln!(
            "  (backlog of {n} batches per topic landed in {:.1} s: {:.0} MB in the warehouse)",
            started.elapsed().as_secs_f64(),
            dir_bytes(&home.join("warehouse")) as f64 / 1e6
        );
        let run = scheduled_in_fresh_process(config, &home)?;
        let mb = json_bytes as f64 / 1e6;
        println!(
            "backlog {n} batches per topic ({mb:.0} MB event JSON): scheduled {:.2} s wall, {:.2} CPU-s \
             ({:.2} cores busy, {} threads), peak RSS {:.0} MB, {:.0} MB/s of event JSON; \
             {} rows, {} files, {} batches in {} rounds (commit {:.2} s), {} partitions compacted \
             ({:.2} s); {} units of work, {:.2} s of work{}{}",
            run.wall_s,
            run.cpu_s,
            run.cpu_s / run.wall_s.max(1e-9),
            run.threads,
            run.rss_mb,
            mb / run.wall_s.max(1e-9),
            run.rows,
            run.files,
            run.batches,
            run.rounds,
            run.commit_s,
            run.partitions_compacted,
            run.compaction_s,
            run.units,
            run.unit_busy_s,
            if run.backlog_left > 0 {
                format!("; {} batches LEFT", run.backlog_left)
            } else {
                String::new()
            },
            if run.failures.is_empty() {
                String::new()
            } else {
                format!("; FAILURES: {}", run.failures.join(" | "))
            }
        );
        if keep {
            println!(
                "  kept: {} (after the run; its backlog is committed)",
                home.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&home);
        }
    }
    Ok(())
}

/// Lands `batches` ESM batches of each topic in `home`; returns the bytes of event JSON.
async fn prepare(
    spec: &crate::spec::PipelineSpec,
    home: &Path,
    batches: u64,
    records: u64,
    partitions: i32,
) -> Result<u64> {
    let backend = Backend::connect(&BackendConfig::Embedded {
        home: home.to_path_buf(),
    })
    .await?;
    let ingestor = Ingestor::new(spec, &backend)?;
    let step_us = 36_000;
    let span_ms = (batches * records) as i64 * step_us / 1000;
    let timeline = crate::cli::Timeline::from(now_ms() - span_ms - 3_600_000, step_us);
    let disorder = crate::cli::Disorder::default();
    let mut factory = EventFactory::new(42);
    let mut offsets: Vec<Vec<i64>> = TOPICS
        .iter()
        .map(|_| vec![0; partitions.max(1) as usize])
        .collect();
    let mut bytes = 0u64;
    for b in 0..batches {
        for (t, topic) in TOPICS.iter().enumerate() {
            let recs = crate::cli::synthetic_stream(
                &mut factory,
                topic,
                records,
                &mut offsets[t],
                b * records,
                0,
                &timeline,
                &disorder,
            );
            let event = esm_event(&recs);
            bytes += event.len() as u64;
            let parsed: crate::esm::EsmEvent = serde_json::from_str(&event)
                .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
            let summary = ingestor.handle(&parsed).await?;
            let landed = summary.accepted + summary.key_deletes + summary.dead_lettered;
            if landed < records {
                return Err(Error::Internal(format!(
                    "a {topic} batch landed {landed} of {records} records"
                )));
            }
        }
    }
    Ok(bytes)
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

fn scheduled_in_fresh_process(config: &Config, home: &Path) -> Result<Run> {
    scheduled_with_spec(config.pipeline.as_deref(), home)
}

fn scheduled_with_spec(pipeline: Option<&Path>, home: &Path) -> Result<Run> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("find executable", "streamtable-bench", e))?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(p) = pipeline {
        cmd.arg("--pipeline").arg(p);
    }
    cmd.args(["scale-once", "--home"]).arg(home);
    if let Ok(dir) = std::env::var("STREAMTABLE_BENCH_SCALE_COPY") {
        // A copy of the backlog before the run, to run it again by hand.
        let _ = std::process::Command::new("cp")
            .args(["-a"])
            .arg(home)
            .arg(dir)
            .status();
    }
    let out = cmd
        .output()
        .map_err(|e| Error::io("run", "streamtable-bench scale-once", e))?;
    if !out.status.success() {
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        return Err(Error::Internal(format!(
            "streamtable-bench scale-once failed ({})",
            out.status
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .map_err(|e| Error::Internal(format!("scale-once printed {text:?}: {e}")))
}

/// `streamtable-bench scale-once`: one scheduled run on `home`, printed as one JSON line.
pub(super) async fn scale_once(config: &Config, home: &Path) -> Result<()> {
    let spec = config.load_pipeline()?;
    let backend = Backend::connect(&BackendConfig::Embedded {
        home: home.to_path_buf(),
    })
    .await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    let options = streamtable::scheduled::ScheduledOptions::from_env()?;
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let report = streamtable::scheduled::run(&backend, &tables, &options).await?;
    let run = Run {
        wall_s: t0.elapsed().as_secs_f64(),
        cpu_s: cpu_seconds() - c0,
        rss_mb: peak_rss_kb() as f64 / 1024.0,
        rows: report.commit.rows(),
        files: report.commit.files(),
        batches: report.commit.batches,
        rounds: report.commit.rounds,
        commit_s: report.commit.duration_ms / 1e3,
        compaction_s: report.compaction.iter().map(|c| c.duration_ms).sum::<f64>() / 1e3,
        partitions_compacted: report.compaction.len() as u64,
        backlog_left: report.commit.backlog.batches,
        failures: report
            .failures
            .iter()
            .map(|f| format!("{}: {}", f.stage, f.error))
            .collect(),
        threads: options.concurrency(),
        units: report.units.run,
        unit_busy_s: report.units.busy_ms / 1e3,
    };
    println!(
        "{}",
        serde_json::to_string(&run).map_err(|e| Error::Internal(e.to_string()))?
    );
    Ok(())
}

/// The upsert table of these measurements: `orders_current` as shipped (keyed by `order_id`,
/// unpartitioned).
const UPSERT_SPEC: &str = r#"
[[tables]]
name = "orders_current"
topic = "order_status"
mode = "upsert"
primary_key = ["order_id"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "status", type = "string" },
  { name = "amount", type = "decimal(12,2)" },
  { name = "updated_at", type = "timestamp", required = true },
]
"#;

/// Status records of `keys` (a key always on the same partition of 4).
fn status_records(
    keys: impl Iterator<Item = u64>,
    offsets: &mut [i64; 4],
    rng: &mut crate::generate::Rng,
    at_ms: i64,
) -> Vec<crate::generate::SourceRecord> {
    const STATUS: [&str; 4] = ["placed", "paid", "shipped", "cancelled"];
    keys.map(|k| {
        let partition = (k % 4) as i32;
        let offset = offsets[partition as usize];
        offsets[partition as usize] += 1;
        let value = format!(
            r#"{{"order_id":"ord-{k:010}","status":"{}","amount":"{}.{:02}","updated_at":"{}"}}"#,
            STATUS[rng.below(4) as usize],
            rng.below(500),
            rng.below(100),
            crate::clock::rfc3339_ms(at_ms)
        );
        crate::generate::SourceRecord {
            topic: "order_status".into(),
            partition,
            offset,
            timestamp_ms: at_ms,
            key: Some(format!("ord-{k:010}").into_bytes()),
            value: Some(value.into_bytes()),
            raw_value_field: None,
        }
    })
    .collect()
}

/// `streamtable-bench scale --upsert-keys K,...`: an unpartitioned upsert table of K keys
/// (landed in batches of 10,000, committed every 20 batches, then compacted), then 10,000
/// changes of existing keys, then ONE scheduled run in a fresh process (the key index read cold).
pub(super) async fn upsert_scale(keys: &[u64], changes: u64) -> Result<()> {
    println!(
        "upsert: an unpartitioned upsert table of K keys, then {changes} changes of existing keys, \
         then one `streamtable scheduled` in a fresh process"
    );
    for &k in keys {
        let home = tempdir(&format!("bench-scale-upsert-{k}"))?;
        let spec_path = home.join("upsert.toml");
        std::fs::write(&spec_path, UPSERT_SPEC).map_err(|e| Error::io("write", &spec_path, e))?;
        let spec = crate::spec::PipelineSpec::load(&spec_path, &streamtable::process::Planner)?;
        let backend = Backend::connect(&BackendConfig::Embedded {
            home: home.to_path_buf(),
        })
        .await?;
        let tables = TableSet::new(&spec, &backend.namespace)?;
        let ingestor = Ingestor::new(&spec, &backend)?;
        let mut rng = crate::generate::Rng::new(7);
        let mut offsets = [0i64; 4];
        let at = now_ms() - 3_600_000;
        let started = Instant::now();
        let batch = 10_000u64;
        let mut n = 0u64;
        while n < k {
            let end = (n + batch).min(k);
            let records = status_records(n..end, &mut offsets, &mut rng, at);
            ingestor
                .handle(&crate::generate::kafka_event(&records))
                .await?;
            n = end;
            if (n / batch).is_multiple_of(20) || n == k {
                streamtable::commit::commit_pending(&backend, &tables).await?;
            }
        }
        streamtable::compact::compact_all(
            &backend,
            &tables,
            &streamtable::compact::CompactOptions {
                min_input_files: 2,
                ..Default::default()
            },
        )
        .await?;
        let changed: Vec<u64> = (0..changes).map(|_| rng.below(k.max(1))).collect();
        let records = status_records(changed.into_iter(), &mut offsets, &mut rng, at + 60_000);
        ingestor
            .handle(&crate::generate::kafka_event(&records))
            .await?;
        eprintln!(
            "  ({k} keys landed, committed and compacted, {changes} changes landed, in {:.1} s: {:.0} MB in the warehouse)",
            started.elapsed().as_secs_f64(),
            dir_bytes(&home.join("warehouse")) as f64 / 1e6
        );
        drop(ingestor);
        drop(backend);
        let run = scheduled_with_spec(Some(&spec_path), &home)?;
        println!(
            "{k} keys: scheduled {:.2} s wall, {:.2} CPU-s, peak RSS {:.0} MB; commit {:.2} s ({} rows), \
             {} partitions compacted ({:.2} s){}",
            run.wall_s,
            run.cpu_s,
            run.rss_mb,
            run.commit_s,
            run.rows,
            run.partitions_compacted,
            run.compaction_s,
            if run.failures.is_empty() {
                String::new()
            } else {
                format!("; FAILURES: {}", run.failures.join(" | "))
            }
        );
        let _ = std::fs::remove_dir_all(&home);
    }
    Ok(())
}
