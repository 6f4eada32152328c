//! `streamtable-bench audit`: what `streamtable audit` costs per million rows. Order events land
//! (4 partitions, ESM batches of 10,000, one bad record in 250) into an append table on the
//! embedded backend, are committed and compacted as the scheduled stage does (each commit round
//! auditing its own files, whose time is reported); then the audit runs (median of 3) and must
//! find every offset once.

use std::time::Instant;

use super::{cpu_seconds, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::error::{Error, Result};
use crate::generate::{EventFactory, kafka_event};
use crate::tables::TableSet;
use streamtable::compact::{CompactOptions, compact_all};
use streamtable::ingest::Ingestor;

/// Lands `records` orders, then times the audit.
pub async fn audit(records: u64) -> Result<()> {
    let spec = streamtable::spec::PipelineSpec::parse(
        r#"
[[tables]]
name = "orders"
topic = "orders"
partition_by = ["day(created_at)"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "customer_id", type = "string" },
  { name = "amount", type = "decimal(18,2)", required = true },
  { name = "country", type = "string" },
  { name = "created_at", type = "timestamp", required = true },
]
"#,
        std::path::Path::new("bench-audit.toml"),
        &streamtable::process::Planner,
    )?;
    let home = tempdir("bench-audit")?;
    let backend = Backend::connect(&BackendConfig::Embedded { home: home.clone() }).await?;
    let tables = TableSet::new(&spec, &backend.namespace)?;
    let ingestor = Ingestor::new(&spec, &backend)?;
    let mut factory = EventFactory::new(11);
    let mut offsets = vec![0i64; 4];
    let started = Instant::now();
    let mut sent = 0;
    let mut rounds = streamtable::commit::audit::RoundAudit::default();
    while sent < records {
        let count = 10_000.min(records - sent);
        let batch = streamtable::cli::synthetic_records(
            &mut factory,
            "orders",
            count,
            &mut offsets,
            sent,
            250,
            1_795_946_400_000,
        );
        ingestor.handle(&kafka_event(&batch)).await?;
        sent += count;
        if sent % 200_000 == 0 || sent == records {
            let report = streamtable::commit::commit_pending(&backend, &tables).await?;
            rounds.add(report.audit);
        }
    }
    compact_all(&backend, &tables, &CompactOptions::default()).await?;
    if !rounds.ok() || rounds.delivered != records {
        return Err(Error::Internal(format!(
            "the commit rounds' audits failed on an honest run: {rounds:?}"
        )));
    }
    println!(
        "commit rounds' own audits: {} rounds, {} records, {:.0} ms ({:.2} s per million records)",
        rounds.rounds,
        rounds.delivered,
        rounds.duration_ms,
        rounds.duration_ms / 1e3 / (records as f64 / 1e6)
    );
    println!(
        "landed {records} records in {:.1} s (4 partitions, compacted)",
        started.elapsed().as_secs_f64()
    );
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..3 {
        let (t, c) = (Instant::now(), cpu_seconds());
        let found = streamtable::audit::audit(&backend, &spec, None).await?;
        times.push(t.elapsed().as_secs_f64());
        cpu.push(cpu_seconds() - c);
        if !found.ok() {
            return Err(Error::Internal(format!(
                "the audit failed on an honest run:\n{}",
                streamtable::cli::audit::render(&found)
            )));
        }
    }
    times.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    let per_million = times[1] / records.max(1) as f64 * 1e6;
    println!(
        "audit of {records} offsets: median {:.3} s ({:.0} offsets/s, {per_million:.2} s per million rows; CPU {:.2} s); runs {:.3?}",
        times[1],
        records as f64 / times[1],
        cpu[1],
        times
    );
    let _ = std::fs::remove_dir_all(home);
    Ok(())
}
